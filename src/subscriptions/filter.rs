//! Property filters (seed 003's `event_property_setting`): conditions on a
//! change's `data` (the row after) and `old` (the changed columns' previous
//! values), evaluated by a pure function before the router POSTs.
//!
//! | op | holds when | CLI form | JSON form |
//! |---|---|---|---|
//! | `eq` | `data.<field>` equals the value | `status:eq:2` | `{"field":"status","op":"eq","value":2}` |
//! | `ne` | `data.<field>` is absent or differs | `status:ne:0` | `{"field":"status","op":"ne","value":0}` |
//! | `in` | `data.<field>` equals one of the values | `status:in:1,2` | `{"field":"status","op":"in","values":[1,2]}` |
//! | `changed` | `old` holds the field (it changed), its previous value is `from` and its new one `to` (each optional) | `status:changed:1->2` | `{"field":"status","op":"changed","from":1,"to":2}` |
//!
//! All filters of a subscription must hold. `field` is a column, or a path
//! into nested objects with dots (`address.city`). Values compare as JSON,
//! except that numbers, numeric strings and booleans compare by number
//! (`1`, `"1"`, `"1.0"` and `true` are equal): the binlog renders a DECIMAL as
//! a string and a TINYINT(1) as a number. An insert has no `old`, so
//! `changed` never holds for it. In the CLI form each value is read as JSON
//! when it parses (`2`, `"2"`, `null`, `true`) and as a string otherwise (`paid`).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::Invalid;

/// The accepted operators, for error messages.
pub const OPS: &str = "eq, ne, in, changed";

/// Longest field name (the `property_filters.field` column).
pub const FIELD_CHARS: usize = 64;

/// A condition on one field of a change.
#[derive(Debug, Clone, PartialEq)]
pub struct PropertyFilter {
    /// Column (or dotted path into nested objects).
    pub field: String,
    /// What must hold for it.
    pub condition: Condition,
}

/// The test a [`PropertyFilter`] applies to its field.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The new value equals this one.
    Eq(Value),
    /// The new value is absent or differs from this one.
    Ne(Value),
    /// The new value equals one of these.
    In(Vec<Value>),
    /// The field changed (it is in `old`), from `from` to `to` when given
    /// (`Some(Value::Null)`: from or to SQL NULL; `None`: any value).
    Changed {
        /// Required previous value.
        from: Option<Value>,
        /// Required new value.
        to: Option<Value>,
    },
}

/// A filter as the admin API and `--output json` write it, and as stored:
/// `{"field", "op", "value"}`, `{"field", "op": "in", "values"}` or
/// `{"field", "op": "changed", "from", "to"}`. [`FilterSpec::check`] turns it
/// into a [`PropertyFilter`], naming the field at fault.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    /// Column (or dotted path).
    pub field: String,
    /// One of [`OPS`].
    pub op: String,
    /// The value of `eq` / `ne`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Value>,
    /// The values of `in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Value>>,
    /// The previous value of `changed` (absent: any).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub from: Option<Value>,
    /// The new value of `changed` (absent: any).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub to: Option<Value>,
}

/// A field that is present is `Some`, even when it is `null` (absent: the
/// `default`, `None`): `"from": null` means "from SQL NULL", not "from anything".
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl FilterSpec {
    /// The filter this spec describes; `path` names it in errors (`filters[0]`).
    pub fn check(&self, path: &str) -> Result<PropertyFilter, Invalid> {
        let field = |f: &str| format!("{path}.{f}");
        let name = self.field.trim();
        if name.is_empty()
            || name.chars().count() > FIELD_CHARS
            || name.split('.').any(str::is_empty)
        {
            return Err(Invalid::new(
                field("field"),
                format!(
                    "`{}` is not a field name: 1 to {FIELD_CHARS} characters, nested fields joined by dots (status, address.city)",
                    self.field
                ),
            ));
        }
        let unexpected = |name: &str, set: bool| -> Result<(), Invalid> {
            match set {
                true => Err(Invalid::new(
                    field(name),
                    format!("not used by op `{}`", self.op),
                )),
                false => Ok(()),
            }
        };
        let value = || {
            self.value.clone().ok_or_else(|| {
                Invalid::new(field("value"), format!("op `{}` needs a value", self.op))
            })
        };
        let condition = match self.op.as_str() {
            "eq" | "ne" => {
                unexpected("values", self.values.is_some())?;
                unexpected("from", self.from.is_some())?;
                unexpected("to", self.to.is_some())?;
                if self.op == "eq" {
                    Condition::Eq(value()?)
                } else {
                    Condition::Ne(value()?)
                }
            }
            "in" => {
                unexpected("value", self.value.is_some())?;
                unexpected("from", self.from.is_some())?;
                unexpected("to", self.to.is_some())?;
                match &self.values {
                    Some(values) if !values.is_empty() => Condition::In(values.clone()),
                    _ => {
                        return Err(Invalid::new(
                            field("values"),
                            "op `in` needs a non-empty list of values",
                        ));
                    }
                }
            }
            "changed" => {
                unexpected("value", self.value.is_some())?;
                unexpected("values", self.values.is_some())?;
                Condition::Changed {
                    from: self.from.clone(),
                    to: self.to.clone(),
                }
            }
            other => {
                return Err(Invalid::new(
                    field("op"),
                    format!("`{other}` is not one of {OPS}"),
                ));
            }
        };
        Ok(PropertyFilter {
            field: name.to_string(),
            condition,
        })
    }
}

impl From<&PropertyFilter> for FilterSpec {
    fn from(f: &PropertyFilter) -> Self {
        let mut spec = FilterSpec {
            field: f.field.clone(),
            op: f.condition.op().to_string(),
            ..FilterSpec::default()
        };
        match &f.condition {
            Condition::Eq(v) | Condition::Ne(v) => spec.value = Some(v.clone()),
            Condition::In(values) => spec.values = Some(values.clone()),
            Condition::Changed { from, to } => {
                spec.from = from.clone();
                spec.to = to.clone();
            }
        }
        spec
    }
}

impl Serialize for PropertyFilter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        FilterSpec::from(self).serialize(s)
    }
}

impl Condition {
    /// The operator's name, as stored.
    pub fn op(&self) -> &'static str {
        match self {
            Self::Eq(_) => "eq",
            Self::Ne(_) => "ne",
            Self::In(_) => "in",
            Self::Changed { .. } => "changed",
        }
    }
}

impl PropertyFilter {
    /// Parses the CLI form `FIELD:OP:VALUE` (see the module doc): `status:eq:2`,
    /// `status:in:1,2,3`, `status:changed:1->2`, `status:changed:->2`,
    /// `status:changed`. `path` names it in errors (`--filter`).
    pub fn parse(text: &str, path: &str) -> Result<Self, Invalid> {
        let forms = "FIELD:eq:VALUE, FIELD:ne:VALUE, FIELD:in:V1,V2, FIELD:changed[:FROM->TO] (FROM or TO may be empty: any)";
        let mut parts = text.splitn(3, ':');
        let (field, op, rest) = (parts.next().unwrap_or(""), parts.next(), parts.next());
        let Some(op) = op else {
            return Err(Invalid::new(
                path,
                format!("`{text}` is not a filter; accepted forms: {forms}"),
            ));
        };
        let mut spec = FilterSpec {
            field: field.to_string(),
            op: op.to_string(),
            ..FilterSpec::default()
        };
        match (op, rest) {
            ("eq" | "ne", Some(v)) => spec.value = Some(cli_value(v)),
            ("in", Some(v)) => spec.values = Some(v.split(',').map(cli_value).collect()),
            ("changed", None) => {}
            ("changed", Some(v)) => {
                let Some((from, to)) = v.split_once("->") else {
                    return Err(Invalid::new(
                        path,
                        format!(
                            "`{text}`: a change is FROM->TO, e.g. status:changed:1->2; accepted forms: {forms}"
                        ),
                    ));
                };
                spec.from = (!from.is_empty()).then(|| cli_value(from));
                spec.to = (!to.is_empty()).then(|| cli_value(to));
            }
            ("eq" | "ne" | "in", None) => {
                return Err(Invalid::new(
                    path,
                    format!("`{text}`: op `{op}` needs a value; accepted forms: {forms}"),
                ));
            }
            _ => {}
        }
        spec.check(path).map_err(|e| {
            Invalid::new(
                path,
                format!("`{text}`: {}; accepted forms: {forms}", e.reason),
            )
        })
    }

    /// Whether this filter holds for a change whose row after is `data`
    /// and whose changed columns' previous values are `old` (`null` for
    /// inserts and deletes).
    pub fn matches(&self, data: &Value, old: &Value) -> bool {
        let current = lookup(data, &self.field);
        match &self.condition {
            Condition::Eq(v) => current.is_some_and(|c| same(c, v)),
            Condition::Ne(v) => !current.is_some_and(|c| same(c, v)),
            Condition::In(values) => current.is_some_and(|c| values.iter().any(|v| same(c, v))),
            Condition::Changed { from, to } => {
                let Some(previous) = lookup(old, &self.field) else {
                    return false;
                };
                let now = current.unwrap_or(&Value::Null);
                !same(previous, now)
                    && from.as_ref().is_none_or(|f| same(previous, f))
                    && to.as_ref().is_none_or(|t| same(now, t))
            }
        }
    }

    /// The CLI form of this filter ([`PropertyFilter::parse`] reads it back).
    pub fn to_cli(&self) -> String {
        let text = |v: &Value| match v {
            // A string that would read back as something else keeps its quotes.
            Value::String(s)
                if serde_json::from_str::<Value>(s).is_err()
                    && !s.contains([',', ':'])
                    && !s.contains("->") =>
            {
                s.clone()
            }
            other => other.to_string(),
        };
        let f = &self.field;
        match &self.condition {
            Condition::Eq(v) => format!("{f}:eq:{}", text(v)),
            Condition::Ne(v) => format!("{f}:ne:{}", text(v)),
            Condition::In(values) => format!(
                "{f}:in:{}",
                values.iter().map(text).collect::<Vec<_>>().join(",")
            ),
            Condition::Changed {
                from: None,
                to: None,
            } => format!("{f}:changed"),
            Condition::Changed { from, to } => {
                format!(
                    "{f}:changed:{}->{}",
                    from.as_ref().map(text).unwrap_or_default(),
                    to.as_ref().map(text).unwrap_or_default()
                )
            }
        }
    }
}

/// Whether every filter holds (no filters: true).
pub fn all_match(filters: &[PropertyFilter], data: &Value, old: &Value) -> bool {
    filters.iter().all(|f| f.matches(data, old))
}

/// A CLI value: JSON when it parses, a string otherwise.
fn cli_value(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Value::String(text.trim().to_string()))
}

/// The value at a dotted `path` of `root`, if present (a present `null` is `Some`).
fn lookup<'v>(root: &'v Value, path: &str) -> Option<&'v Value> {
    if let Some(v) = root.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(root, |v, key| v.get(key))
}

/// Equal as JSON, or as numbers (see the module doc).
fn same(a: &Value, b: &Value) -> bool {
    a == b || matches!((number(a), number(b)), (Some(x), Some(y)) if x == y)
}

/// A scalar read as a number: numbers, numeric strings, booleans (1 / 0).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|x| x.is_finite()),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(text: &str) -> PropertyFilter {
        PropertyFilter::parse(text, "--filter").unwrap()
    }

    /// Seed 003's example: only when status goes 1 -> 2.
    #[test]
    fn status_from_1_to_2_holds_only_for_that_update() {
        let f = filter("status:changed:1->2");
        let row = |status| json!({"id": 1001, "name": "x", "status": status});
        assert!(f.matches(&row(2), &json!({"status": 1})));
        assert!(
            f.matches(&row(2), &json!({"status": "1"})),
            "a numeric string is the number"
        );
        assert!(!f.matches(&row(3), &json!({"status": 1})), "1 -> 3");
        assert!(!f.matches(&row(2), &json!({"status": 0})), "0 -> 2");
        assert!(
            !f.matches(&row(2), &json!({"name": "y"})),
            "status did not change"
        );
        assert!(!f.matches(&row(2), &Value::Null), "an insert has no old");
        assert!(
            !f.matches(&row(1), &json!({"status": 1})),
            "old equal to new is no change"
        );
    }

    #[test]
    fn changed_with_one_side_or_none() {
        let to_2 = filter("status:changed:->2");
        assert!(to_2.matches(&json!({"status": 2}), &json!({"status": 0})));
        assert!(!to_2.matches(&json!({"status": 3}), &json!({"status": 0})));
        let from_1 = filter("status:changed:1->");
        assert!(from_1.matches(&json!({"status": 9}), &json!({"status": 1})));
        assert!(!from_1.matches(&json!({"status": 9}), &json!({"status": 2})));
        let any = filter("status:changed");
        assert!(any.matches(&json!({"status": 9}), &json!({"status": 1})));
        assert!(!any.matches(&json!({"status": 9}), &json!({"phone": "1"})));
        let from_null = filter("paid_at:changed:null->");
        assert!(
            from_null.matches(&json!({"paid_at": "2026-12-01"}), &json!({"paid_at": null})),
            "from SQL NULL"
        );
        assert!(!from_null.matches(
            &json!({"paid_at": "2026-12-02"}),
            &json!({"paid_at": "2026-12-01"})
        ));
    }

    #[test]
    fn eq_ne_in_on_data() {
        let data = json!({"status": 2, "city": "Hangzhou", "amount": "12.50", "vip": true, "address": {"zip": "310000"}});
        assert!(filter("status:eq:2").matches(&data, &Value::Null));
        assert!(
            filter("status:eq:\"2\"").matches(&data, &Value::Null),
            "string and number compare by number"
        );
        assert!(!filter("status:eq:3").matches(&data, &Value::Null));
        assert!(
            filter("city:eq:Hangzhou").matches(&data, &Value::Null),
            "a bare word is a string"
        );
        assert!(
            filter("amount:eq:12.5").matches(&data, &Value::Null),
            "a DECIMAL string"
        );
        assert!(
            filter("vip:eq:1").matches(&data, &Value::Null),
            "TINYINT(1) true is 1"
        );
        assert!(
            filter("address.zip:eq:310000").matches(&data, &Value::Null),
            "a dotted path"
        );
        assert!(filter("status:ne:0").matches(&data, &Value::Null));
        assert!(!filter("status:ne:2").matches(&data, &Value::Null));
        assert!(
            filter("missing:ne:2").matches(&data, &Value::Null),
            "an absent field differs"
        );
        assert!(!filter("missing:eq:2").matches(&data, &Value::Null));
        assert!(filter("status:in:1,2,3").matches(&data, &Value::Null));
        assert!(!filter("status:in:4,5").matches(&data, &Value::Null));
        assert!(filter("city:in:Beijing,Hangzhou").matches(&data, &Value::Null));
        assert!(!filter("missing:in:1").matches(&data, &Value::Null));
        let all = [filter("status:eq:2"), filter("city:eq:Hangzhou")];
        assert!(all_match(&all, &data, &Value::Null));
        assert!(
            !all_match(
                &[filter("status:eq:2"), filter("city:eq:Beijing")],
                &data,
                &Value::Null
            ),
            "all must hold"
        );
        assert!(all_match(&[], &data, &Value::Null), "no filter: everything");
    }

    #[test]
    fn bad_filters_name_the_field_and_the_accepted_values() {
        for (text, want) in [
            (
                "status",
                "`status` is not a filter; accepted forms: FIELD:eq:VALUE",
            ),
            ("status:gt:2", "`gt` is not one of eq, ne, in, changed"),
            ("status:eq", "op `eq` needs a value"),
            (":eq:2", "is not a field name"),
            ("status:changed:1-2", "a change is FROM->TO"),
        ] {
            let err = PropertyFilter::parse(text, "--filter").unwrap_err();
            assert_eq!(err.field, "--filter", "{text}");
            assert!(err.reason.contains(want), "{text}: {}", err.reason);
        }
        let spec: FilterSpec =
            serde_json::from_value(json!({"field": "status", "op": "in", "values": []})).unwrap();
        let err = spec.check("filters[1]").unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.reason.as_str()),
            (
                "filters[1].values",
                "op `in` needs a non-empty list of values"
            )
        );
        let spec: FilterSpec =
            serde_json::from_value(json!({"field": "status", "op": "eq", "value": 1, "to": 2}))
                .unwrap();
        assert_eq!(spec.check("filters[0]").unwrap_err().field, "filters[0].to");
        let spec: FilterSpec =
            serde_json::from_value(json!({"field": "status", "op": "like", "value": 1})).unwrap();
        let err = spec.check("filters[0]").unwrap_err();
        assert_eq!(
            err.to_string(),
            "filters[0].op: `like` is not one of eq, ne, in, changed"
        );
    }

    #[test]
    fn the_json_and_cli_forms_round_trip() {
        for text in [
            "status:eq:2",
            "status:ne:\"0\"",
            "city:in:Beijing,Hangzhou",
            "status:changed:1->2",
            "status:changed:->2",
            "status:changed",
            "paid_at:changed:null->",
        ] {
            let f = filter(text);
            assert_eq!(f.to_cli(), text);
            let json = serde_json::to_value(&f).unwrap();
            let back: FilterSpec = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(back.check("f").unwrap(), f, "{json}");
        }
        assert_eq!(
            serde_json::to_value(filter("status:changed:null->2")).unwrap(),
            json!({"field": "status", "op": "changed", "from": null, "to": 2})
        );
    }
}
