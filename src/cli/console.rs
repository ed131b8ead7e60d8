//! `orderpipe console`: serves the operator's web UI (see
//! [`crate::console`] and docs/console.md).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;

use super::consume::shutdown_signal;
use crate::config::Settings;
use crate::console::{self, ConsoleState};
use crate::db::Db;

/// Flags of `orderpipe console`; each overrides its `[console]` key.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Listen address (console.listen; port 0 = any free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Change nothing: no action button, every state change refused with
    /// 403, whatever the role (console.read_only).
    #[arg(long)]
    read_only: bool,
    /// Apply the database migrations first (the audit table is in them).
    #[arg(long)]
    migrate: bool,
}

/// Runs `orderpipe console` until SIGTERM or SIGINT.
pub async fn run(settings: &Settings, args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    super::signals::install()?;
    let mut settings = settings.clone();
    if let Some(listen) = args.listen {
        settings.console.listen = listen.to_string();
    }
    settings.console.read_only |= args.read_only;
    let addr: SocketAddr = settings.console.listen.parse().map_err(|_| {
        anyhow::anyhow!(
            "console.listen: `{}` is not HOST:PORT",
            settings.console.listen
        )
    })?;
    let db = Db::connect(&settings.database, settings.database.pool_size())?;
    if args.migrate {
        db.migrate().await?;
    }
    let read_only = settings.console.read_only;
    let state = ConsoleState::new(settings, db).map_err(|e| anyhow::anyhow!("{e}"))?;
    console::serve(
        addr,
        state,
        |bound| {
            let mode = if read_only { " (read-only)" } else { "" };
            eprintln!("console listening on http://{bound}{mode}");
        },
        shutdown_signal(),
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}
