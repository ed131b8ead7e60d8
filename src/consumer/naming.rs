//! The house pattern of consumer group names (seed 000):
//! `{service}.{event}.consumer`, e.g. `inventory-service.order.consumer` or
//! `inventory-service.order.created.consumer`: a service, one or more
//! segments of the event (or its domain), then `consumer`; lower case,
//! digits, `-` and `_`, dot-separated.
//!
//! `consume` and `deliver` log a warning at start for a group that does not
//! follow it (a running group is never refused: renaming a group starts a
//! new one, with no offsets). The Helm chart refuses such a group at
//! render unless `naming.enforce` is false; its template holds the same
//! pattern (`helm/orderpipe/templates/_helpers.tpl`, `orderpipe.groupPattern`).

use std::sync::LazyLock;

use regex::Regex;

/// The pattern, as a regular expression (the chart's is the same).
pub const GROUP_PATTERN: &str = r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+\.consumer$";

static PATTERN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(GROUP_PATTERN).expect("the group pattern compiles"));

/// Ok when `group` follows the house pattern; otherwise why not, with a
/// name that would, for the warning.
pub fn check(group: &str) -> Result<(), String> {
    if PATTERN.is_match(group) {
        return Ok(());
    }
    Err(format!(
        "consumer group `{group}` does not follow the house pattern {{service}}.{{event}}.consumer, \
         e.g. inventory-service.order.consumer; a new group can take such a name, a running one keeps its \
         offsets only under its own name (docs/configuration.md, \"Consumer group names\")"
    ))
}

/// Logs the warning of [`check`] for `group`.
pub fn warn_unless_house_pattern(group: &str) {
    if let Err(why) = check(group) {
        tracing::warn!(group, "{why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_house_pattern() {
        for good in [
            "inventory-service.order.consumer",
            "inventory-service.order.created.consumer",
            "payment_svc.order.payment.succeeded.consumer",
            "crm.order.consumer",
        ] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in [
            "http.crm",
            "tour",
            "order.consumer",
            "Inventory.order.consumer",
            "inv..order.consumer",
            "inv.order.consumer.",
            "inv.order.consumers",
            ".order.consumer",
            "inv.-.consumer x",
        ] {
            let err = check(bad).unwrap_err();
            assert!(
                err.contains(&format!("`{bad}`")) && err.contains("{service}.{event}.consumer"),
                "{bad}: {err}"
            );
        }
    }
}
