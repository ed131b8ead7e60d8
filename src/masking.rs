//! Personal data kept out of sight: the field paths of `console.masked_fields`
//! (`data.mobile`, `data.*.email`) are replaced by [`MASK`] wherever an
//! operator reads a decoded record (the console's explorer, search and
//! dead-letter pages, `orderpipe dlq show` and `orderpipe search`), unless
//! they reveal it, which the audit records.
//!
//! A path is dot-separated from the root of the decoded record as shown
//! (the envelope: `data.mobile`; a row change's columns: `data.data.mobile`);
//! `*` stands for any one key or array index. A path that names an object
//! or an array masks all of it.
//!
//! What never leaves `cdc` as it is has its rules here too ([`ColumnRules`]:
//! per table, the columns to drop, hash or mask), read from `[cdc.redact]`
//! and from the control plane's `cdc_sources.redact`; `cdc::redact` applies them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a masked value shows.
pub const MASK: &str = "•••";

/// Where a decoded record sits in the explorer's record view (JSON pointer).
pub const RECORD_VIEW_JSON: &str = "/decoded/json";

/// The paths to mask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldMask {
    paths: Vec<Vec<String>>,
}

impl FieldMask {
    /// The mask of `paths`; a path with an empty segment names the field and why.
    pub fn parse(paths: &[String]) -> Result<Self, String> {
        let mut parsed = Vec::new();
        for path in paths {
            let segments: Vec<String> = path.split('.').map(str::to_string).collect();
            if segments.iter().any(String::is_empty) {
                return Err(format!(
                    "console.masked_fields: `{path}` is not a field path (dot-separated names or *, e.g. data.mobile, data.*.email)"
                ));
            }
            parsed.push(segments);
        }
        Ok(Self { paths: parsed })
    }

    /// Whether it masks nothing.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Masks every value at a path of `value`; returns how many.
    pub fn apply(&self, value: &mut Value) -> usize {
        self.paths.iter().map(|p| mask_at(value, p)).sum()
    }

    /// Masks the paths relative to the value at the JSON `pointer` of
    /// `value` (a record view's `/decoded/json`); returns how many.
    pub fn apply_under(&self, value: &mut Value, pointer: &str) -> usize {
        value.pointer_mut(pointer).map_or(0, |v| self.apply(v))
    }

    /// `value` with its paths masked.
    pub fn masked(&self, mut value: Value) -> Value {
        self.apply(&mut value);
        value
    }
}

fn mask_at(value: &mut Value, path: &[String]) -> usize {
    let Some((first, rest)) = path.split_first() else {
        if value.is_null() {
            return 0;
        }
        *value = Value::String(MASK.to_string());
        return 1;
    };
    match value {
        Value::Object(map) if first == "*" => map.values_mut().map(|v| mask_at(v, rest)).sum(),
        Value::Object(map) => map.get_mut(first).map_or(0, |v| mask_at(v, rest)),
        Value::Array(items) if first == "*" => items.iter_mut().map(|v| mask_at(v, rest)).sum(),
        Value::Array(items) => first
            .parse::<usize>()
            .ok()
            .and_then(|i| items.get_mut(i))
            .map_or(0, |v| mask_at(v, rest)),
        _ => 0,
    }
}

/// One table's rules: the columns to drop, hash and mask.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnRules {
    /// Removed from `data` and `old`, and from the typed schema.
    #[serde(default)]
    pub drop: Vec<String>,
    /// HMAC-SHA-256 of the value's text under `cdc.hash_key`, hex.
    #[serde(default)]
    pub hash: Vec<String>,
    /// `***` (`cdc::redact::MASK`).
    #[serde(default)]
    pub mask: Vec<String>,
}

/// What happens to a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Left out.
    Drop,
    /// HMAC-SHA-256 under `cdc.hash_key`.
    Hash,
    /// A fixed mask.
    Mask,
}

impl Action {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Drop => "drop",
            Action::Hash => "hash",
            Action::Mask => "mask",
        }
    }
}

/// Each table's column -> action, or the first bad rule, named as
/// `field` (`cdc.redact`, or a source's `redact`) and its table.
pub fn check_rules(
    field: &str,
    rules: &BTreeMap<String, ColumnRules>,
) -> Result<BTreeMap<String, BTreeMap<String, Action>>, String> {
    let mut tables = BTreeMap::new();
    for (table, rules) in rules {
        if !crate::table_name::is_db_table(table) {
            return Err(format!(
                "{field}.{table:?}: expected <database>.<table> = {{ drop = [..], hash = [..], mask = [..] }}, \
                 e.g. \"shop.table_user\" = {{ hash = [\"mobile\"] }}"
            ));
        }
        let mut columns = BTreeMap::new();
        for (action, names) in [
            (Action::Drop, &rules.drop),
            (Action::Hash, &rules.hash),
            (Action::Mask, &rules.mask),
        ] {
            for name in names {
                if let Some(before) = columns.insert(name.clone(), action) {
                    return Err(format!(
                        "{field}.{table:?}: column {name:?} is under both `{}` and `{}`; name it once",
                        before.as_str(),
                        action.as_str()
                    ));
                }
            }
        }
        tables.insert(table.clone(), columns);
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_and_wildcards_mask_values_and_leave_the_rest() {
        let mask = FieldMask::parse(&["data.mobile".into(), "data.*.email".into()]).unwrap();
        let mut record = json!({
            "event_id": "e1",
            "data": {
                "mobile": "13800000000",
                "buyer": {"email": "a@example.com", "name": "A"},
                "items": [{"email": "b@example.com"}, {"sku": "s"}],
                "absent": null
            }
        });
        assert_eq!(mask.apply(&mut record), 2, "{record}");
        assert_eq!(record["data"]["mobile"], MASK);
        assert_eq!(record["data"]["buyer"]["email"], MASK);
        assert_eq!(record["data"]["buyer"]["name"], "A");
        assert_eq!(record["event_id"], "e1");
        // `*` is one level: items' emails need `data.items.*.email`.
        assert_eq!(record["data"]["items"][0]["email"], "b@example.com");
        let items = FieldMask::parse(&["data.items.*.email".into()]).unwrap();
        assert_eq!(items.apply(&mut record), 1);
        assert!(
            FieldMask::parse(&["data..mobile".into()])
                .unwrap_err()
                .contains("not a field path")
        );
    }
}
