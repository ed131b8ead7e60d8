//! `orderpipe schema register` / `schema check` against Apicurio.

use crate::helpers::TestEnv;
use orderpipe::schema::SchemaCatalog;

/// A copy of the built-in schemas with `order.payment.succeeded` gaining `field`.
fn schemas_with_payment_field(field: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let raw = SchemaCatalog::embedded().order_events().raw.clone();
    let anchor = r#"{"name": "paid_at", "type": "string", "doc": "ISO 8601 UTC"}"#;
    assert!(raw.contains(anchor), "anchor moved in the schema file");
    let changed = raw.replace(anchor, &format!("{anchor},\n          {field}"));
    std::fs::write(dir.path().join("order.events.v1.avsc"), changed).unwrap();
    dir
}

#[test]
fn register_is_idempotent_and_check_passes_on_the_same_schema() {
    let env = TestEnv::new();
    let first = env
        .cli(&["schema", "register", "--output", "json"])
        .success();
    let second = env
        .cli(&["schema", "register", "--output", "json"])
        .success();
    assert_eq!(
        first, second,
        "registering the same schema twice must return the same id"
    );
    assert!(
        first.contains(&format!("{}-value", env.settings.topics.order_events.name)),
        "{first}"
    );
    let check = env.cli(&["schema", "check"]).success();
    assert!(check.contains("compatible"), "{check}");
}

#[test]
fn incompatible_change_is_refused_naming_the_field() {
    let env = TestEnv::new();
    env.cli(&["schema", "register"]).success();
    let bad = schemas_with_payment_field(r#"{"name": "channel", "type": "string"}"#);
    let out = env
        .cli(&["schema", "check", "--schemas", bad.path().to_str().unwrap()])
        .failure();
    assert!(out.contains("INCOMPATIBLE"), "{out}");
    assert!(out.contains("data.OrderPaymentSucceeded.channel"), "{out}");

    // Registering it is refused by the registry too.
    let out = env
        .cli(&[
            "schema",
            "register",
            "--schemas",
            bad.path().to_str().unwrap(),
        ])
        .failure();
    assert!(
        out.contains("409") || out.to_lowercase().contains("incompatible"),
        "{out}"
    );
}

#[test]
fn field_added_with_a_default_is_compatible() {
    let env = TestEnv::new();
    env.cli(&["schema", "register"]).success();
    let good =
        schemas_with_payment_field(r#"{"name": "channel", "type": "string", "default": "card"}"#);
    let out = env
        .cli(&[
            "schema",
            "check",
            "--schemas",
            good.path().to_str().unwrap(),
        ])
        .success();
    assert!(!out.contains("INCOMPATIBLE"), "{out}");
}
