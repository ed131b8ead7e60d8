//! Columns that never leave the process as they are: per table
//! (`[cdc.redact."db.table"]`), `drop` removes a column, `hash` replaces
//! its value with HMAC-SHA-256 under `cdc.hash_key` (lower-case hex, so
//! equal values stay equal and joinable, and nobody without the key can
//! test a guess), `mask` with [`MASK`]. Applied to each row image where
//! rows become JSON (the stream and the snapshot), before `old` and the
//! record key are derived from them, and to the table's columns for the
//! typed Avro schema ([`Redaction::columns`]). NULL stays NULL.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::masking::check_rules;
pub use crate::masking::{Action, ColumnRules};

use super::column::{Charset, Column, Kind};
use super::table_schema::TableColumns;

/// What replaces a masked column's value.
pub const MASK: &str = "***";

/// Every table's rules and the hash key, checked.
#[derive(Clone, Default)]
pub struct Redaction {
    /// database -> table -> column -> action: looked up per row without
    /// building a `db.table` string.
    tables: BTreeMap<String, BTreeMap<String, BTreeMap<String, Action>>>,
    /// HMAC-SHA-256 keyed once with `cdc.hash_key`, cloned per value.
    mac: Option<Hmac<Sha256>>,
}

impl std::fmt::Debug for Redaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never prints.
        f.debug_struct("Redaction")
            .field("tables", &self.tables)
            .field("key", &self.mac.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Redaction {
    /// The rules of `[cdc.redact]` with `cdc.hash_key`; an error names the
    /// field: a table not `db.table`, a column under two actions
    /// ([`check_rules`]), a hash without a key (checked here, when cdc
    /// starts, not at load: only the cdc pods get the key).
    pub fn new(
        rules: &BTreeMap<String, ColumnRules>,
        key: Option<&SecretString>,
    ) -> Result<Self, String> {
        let tables = check_rules("cdc.redact", rules)?;
        let hashes = tables
            .values()
            .any(|c| c.values().any(|a| *a == Action::Hash));
        let key = key.filter(|k| !k.expose_secret().is_empty()).cloned();
        if hashes && key.is_none() {
            return Err(
                "cdc.hash_key is unset: cdc.redact hashes a column, which needs a secret key \
                 (ORDERPIPE_CDC__HASH_KEY, at least 32 random bytes)"
                    .into(),
            );
        }
        let mut by_database: BTreeMap<String, BTreeMap<String, _>> = BTreeMap::new();
        for (name, columns) in tables {
            let (database, table) = name.split_once('.').expect("check_rules: db.table");
            by_database
                .entry(database.to_string())
                .or_default()
                .insert(table.to_string(), columns);
        }
        let mac = key.map(|k| {
            Hmac::<Sha256>::new_from_slice(k.expose_secret().as_bytes())
                .expect("HMAC takes a key of any length")
        });
        Ok(Self {
            tables: by_database,
            mac,
        })
    }

    fn rules(&self, database: &str, table: &str) -> Option<&BTreeMap<String, Action>> {
        self.tables
            .get(database)?
            .get(table)
            .filter(|r| !r.is_empty())
    }

    /// Refuses rules that would make every record key of the table the
    /// same: dropping or masking a primary-key column (hash it instead).
    pub fn check_key(&self, database: &str, table: &str, key: &[String]) -> Result<(), String> {
        let Some(rules) = self.rules(database, table) else {
            return Ok(());
        };
        match key
            .iter()
            .find(|c| matches!(rules.get(*c), Some(Action::Drop | Action::Mask)))
        {
            Some(column) => Err(format!(
                "cdc.redact.\"{database}.{table}\": {column:?} is in the primary key, which keys the records; \
                 `{}` would give every row the same key: hash it instead",
                rules[column].as_str()
            )),
            None => Ok(()),
        }
    }

    /// Applies `database.table`'s rules to one row image.
    pub fn apply(&self, database: &str, table: &str, row: &mut Map<String, Value>) {
        let Some(rules) = self.rules(database, table) else {
            return;
        };
        for (column, action) in rules {
            match (action, row.get_mut(column)) {
                (_, None) => {}
                (Action::Drop, Some(_)) => {
                    row.remove(column);
                }
                (_, Some(Value::Null)) => {}
                (Action::Hash, Some(value)) => *value = Value::String(self.hash(value)),
                (Action::Mask, Some(value)) => *value = Value::String(MASK.into()),
            }
        }
    }

    /// HMAC-SHA-256 of the value's text (a string's characters, else its
    /// JSON), lower-case hex.
    fn hash(&self, value: &Value) -> String {
        let mut mac = self
            .mac
            .clone()
            .expect("checked in new: hashing needs a key");
        match value {
            Value::String(s) => mac.update(s.as_bytes()),
            other => mac.update(other.to_string().as_bytes()),
        }
        crate::hex::lower(&mac.finalize().into_bytes())
    }

    /// `columns` as the records carry them: without the dropped ones, the
    /// hashed and masked ones as text (for the typed Avro schema). Borrowed
    /// when the table has no rules.
    pub fn columns<'a>(
        &self,
        database: &str,
        table: &str,
        columns: &'a TableColumns,
    ) -> std::borrow::Cow<'a, TableColumns> {
        let Some(rules) = self.rules(database, table) else {
            return std::borrow::Cow::Borrowed(columns);
        };
        let redacted = columns
            .columns
            .iter()
            .filter_map(|c| match rules.get(&c.name) {
                None => Some(c.clone()),
                Some(Action::Drop) => None,
                Some(Action::Hash | Action::Mask) => Some(Column {
                    kind: Kind::Text {
                        charset: Charset::Utf8,
                    },
                    ..c.clone()
                }),
            })
            .collect();
        std::borrow::Cow::Owned(TableColumns { columns: redacted })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redaction(rules: &str, key: Option<&str>) -> Result<Redaction, String> {
        let rules: BTreeMap<String, ColumnRules> = toml::from_str(rules).unwrap();
        Redaction::new(
            &rules,
            key.map(|k| SecretString::from(k.to_string())).as_ref(),
        )
    }

    #[test]
    fn a_row_loses_its_dropped_columns_and_shows_hashes_and_masks() {
        let r = redaction(
            r#""shop.u" = { drop = ["id_card"], hash = ["mobile", "age"], mask = ["email"] }"#,
            Some("key"),
        )
        .unwrap();
        let mut row = serde_json::json!({
            "id": 7, "id_card": "X1", "mobile": "13800000000", "age": 42, "email": null
        })
        .as_object()
        .unwrap()
        .clone();
        r.apply("shop", "u", &mut row);
        // The oracle: `printf 13800000000 | openssl dgst -sha256 -hmac key`
        // (Python's hmac module gives the same).
        assert_eq!(
            Value::Object(row),
            serde_json::json!({
                "id": 7,
                "mobile": "b087f5cd9eb6ce216d857218015d5671819acf5c13c7c1f5cc67537ee1b28bdb",
                // `printf 42 | openssl dgst -sha256 -hmac key`: a number hashes as its text.
                "age": "f2991b7ce981d0b5adc5e6a0f31acaeb407bfc21354bbcc31a0c43eaffa83d65",
                "email": null
            })
        );
    }

    #[test]
    fn bad_rules_name_the_field() {
        let e = redaction(r#""u" = { drop = ["a"] }"#, None).unwrap_err();
        assert!(
            e.contains("cdc.redact.\"u\"") && e.contains("<database>.<table>"),
            "{e}"
        );
        let e = redaction(r#""s.u" = { drop = ["a"], mask = ["a"] }"#, None).unwrap_err();
        assert!(
            e.contains("\"a\"") && e.contains("drop") && e.contains("mask"),
            "{e}"
        );
        let e = redaction(r#""s.u" = { hash = ["a"] }"#, None).unwrap_err();
        assert!(e.contains("cdc.hash_key"), "{e}");
        let r = redaction(r#""s.u" = { mask = ["id"], hash = ["k2"] }"#, Some("k")).unwrap();
        let e = r.check_key("s", "u", &["id".into()]).unwrap_err();
        assert!(e.contains("primary key") && e.contains("hash it"), "{e}");
        assert!(r.check_key("s", "u", &["k2".into()]).is_ok());
        assert!(!format!("{r:?}").contains("\"k\""), "{r:?}");
    }
}
