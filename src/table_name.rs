//! `<database>.<table>` names, as `cdc` captures tables and as every setting
//! keyed by a captured table names it: `cdc.tables`, redaction rules,
//! snapshot signals, subscription routing keys.

/// Whether `name` is a `<database>.<table>` name: both parts non-empty, the
/// table without another dot.
pub fn is_db_table(name: &str) -> bool {
    name.split_once('.')
        .is_some_and(|(db, t)| !db.is_empty() && !t.is_empty() && !t.contains('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_db_table_name_has_two_non_empty_parts() {
        for good in ["shop.orders", "a.b"] {
            assert!(is_db_table(good), "{good}");
        }
        for bad in ["orders", ".orders", "shop.", "shop.a.b", ""] {
            assert!(!is_db_table(bad), "{bad}");
        }
    }
}
