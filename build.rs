//! Rebuilds when a migration changes: `sqlx::migrate!` embeds `sql/` at compile time.

fn main() {
    println!("cargo:rerun-if-changed=sql");
}
