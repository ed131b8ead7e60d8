//! `orderpipe subs ...`: subscriptions as data (seed 003's control plane)
//! on the command line: `add|list|show|update|enable|disable|remove` of
//! consumers, subscriptions, events and sources, `bindings`, `refresh`,
//! `reload`, `pause|resume` (a subscription's group or a consumer's groups,
//! [`crate::subscriptions::pause`]), and `serve` (the admin HTTP API,
//! [`crate::subscriptions::admin`]).
//!
//! The commands write the tables directly (the database credentials are
//! the authority here); each change also writes a control request that
//! routers poll. Bad input names the flag and the accepted values.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::OutputArg;
use super::consume::shutdown_signal;
use super::group::{PauseArgs, utc};
use super::output::{self, Output};
use crate::config::Settings;
use crate::db::Db;
use crate::delivery::SuccessRule;
use crate::health::HealthState;
use crate::retry::RetryLayer;
use crate::subscriptions::admin::{self, AdminState};
use crate::subscriptions::model::*;
use crate::subscriptions::pause::{self as subscription_pause, GroupAction, PauseTarget};
use crate::subscriptions::record::Record;
use crate::subscriptions::store::{Origin, RequestKind, Store, SubscriptionQuery};
use crate::subscriptions::{Binding, FilterSpec, Invalid, PropertyFilter, SubsError};

/// `orderpipe subs` subcommands.
#[derive(Debug, Subcommand)]
pub enum SubsCommand {
    /// Add a consumer, subscription, event or source.
    #[command(subcommand)]
    Add(AddCommand),
    /// List subscriptions (default), consumers, events or sources.
    List {
        /// What to list.
        #[arg(value_enum, default_value = "subscriptions")]
        kind: Kind,
        /// Subscriptions of this consumer only.
        #[arg(long)]
        consumer: Option<String>,
        /// Subscriptions of this event (routing key) only.
        #[arg(long)]
        event: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Show one record in full.
    Show {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Change a consumer, subscription, event or source; unset flags keep their value.
    #[command(subcommand)]
    Update(UpdateCommand),
    /// Enable a consumer, subscription or source.
    Enable {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Disable a consumer, subscription or source (routers stop serving it within their poll interval).
    Disable {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Remove a record (refused while others refer to it: remove those first).
    Remove {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Pause a subscription's group, or every group of a consumer: nothing
    /// more is delivered, the backlog and the members stay, lag keeps being
    /// reported; survives restarts. A group is one ordered stream, so the
    /// pause holds every subscription of it (the answer names them).
    Pause {
        #[command(flatten)]
        target: PausedTarget,
        #[command(flatten)]
        pause: PauseArgs,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Resume what `subs pause` paused: delivery goes on in order within a second.
    Resume {
        #[command(flatten)]
        target: PausedTarget,
        #[command(flatten)]
        output: OutputArg,
    },
    /// The desired bindings: one consumer group per (consumer, bind_key).
    Bindings {
        /// This consumer's only.
        #[arg(long)]
        consumer: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Ask routers to recompute their groups and reconcile now.
    Refresh {
        /// This consumer's groups only.
        #[arg(long)]
        consumer: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Ask routers to re-read the tables now.
    Reload {
        /// This consumer's only.
        #[arg(long)]
        consumer: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Desired groups vs the broker: missing groups, orphaned groups and
    /// topics (never deleted); without --dry-run also asks routers to refresh.
    /// Exits 1 when something is missing or orphaned.
    Reconcile {
        /// Print the difference only.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Serve the admin HTTP API (and /metrics, /health/*); changes need admin.token.
    Serve {
        /// Listen address (port 0 = any free port; the bound one is printed). Default: admin.listen.
        #[arg(long)]
        addr: Option<SocketAddr>,
        /// Apply the migrations first.
        #[arg(long)]
        migrate: bool,
    },
}

/// What `list` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Subscriptions (event -> consumer).
    Subscriptions,
    /// Downstream consumers.
    Consumers,
    /// Event definitions.
    Events,
    /// Binlog sources.
    Sources,
}

/// One record: `consumer NAME`, `subscription ID`, `event ROUTING_KEY`, `source NAME`.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// consumer, subscription, event or source.
    #[arg(value_enum)]
    kind: TargetKind,
    /// Its name (consumer, source), id (subscription) or routing key (event).
    key: String,
}

/// The kind of a [`Target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TargetKind {
    Consumer,
    Subscription,
    Event,
    Source,
}

/// What `subs pause|resume` acts on: `consumer NAME` or `subscription ID`.
#[derive(Debug, Clone, Args)]
pub struct PausedTarget {
    /// consumer (every group of it) or subscription (its group).
    #[arg(value_enum)]
    kind: PausedKind,
    /// The consumer's name or the subscription's id.
    key: String,
}

/// The kind of a [`PausedTarget`]: only these have groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PausedKind {
    Consumer,
    Subscription,
}

impl PausedTarget {
    fn parse(&self) -> anyhow::Result<PauseTarget> {
        Ok(match self.kind {
            PausedKind::Consumer => PauseTarget::Consumer(self.key.clone()),
            PausedKind::Subscription => {
                PauseTarget::Subscription(self.key.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "subscription: `{}` is not a subscription id (a number; see `subs list`)",
                        self.key
                    )
                })?)
            }
        })
    }
}

/// `subs add ...`.
#[derive(Debug, Subcommand)]
pub enum AddCommand {
    /// A downstream HTTP consumer.
    Consumer(ConsumerArgs),
    /// A subscription: event -> consumer, with a bind key and filters.
    Subscription(SubscriptionArgs),
    /// An event definition (a subscription creates its event when missing).
    Event(EventArgs),
    /// A binlog source (MySQL/MariaDB; its password stays in the cdc process's config).
    Source(SourceArgs),
}

/// `subs update ...`.
#[derive(Debug, Subcommand)]
pub enum UpdateCommand {
    /// A consumer, by name.
    Consumer(ConsumerArgs),
    /// A subscription, by id.
    Subscription(SubscriptionUpdateArgs),
    /// An event definition, by routing key.
    Event(EventArgs),
    /// A source, by name.
    Source(SourceArgs),
}

/// Flags of a consumer.
#[derive(Debug, Args)]
pub struct ConsumerArgs {
    /// Name (a-z, 0-9, - and _): part of its groups' names, so it never changes.
    name: String,
    /// http(s) URL the changes are delivered to (required by add).
    #[arg(long)]
    url: Option<String>,
    /// POST or PUT (add: POST).
    #[arg(long)]
    method: Option<String>,
    /// Per-request timeout in ms (add: 5000).
    #[arg(long)]
    timeout_ms: Option<i64>,
    /// Retry profile: default (1s..16s), 10s-1m-5m, 10s-30s-1m-5m, 5s-30s-5m
    /// (older names seed000, seed001, seed003 still work).
    #[arg(long)]
    retry_profile: Option<String>,
    /// Explicit retry delays instead of a profile, e.g. 5s,30s,5m.
    #[arg(long, value_delimiter = ',')]
    retry_delays: Vec<String>,
    /// Retry jitter, 0 to 1.
    #[arg(long)]
    retry_jitter: Option<f64>,
    /// Drop the retry schedule (the group's [retry] settings decide); update only.
    #[arg(long, conflicts_with_all = ["retry_profile", "retry_delays", "retry_jitter"])]
    clear_retry: bool,
    /// `channel_id` of the body (add: orderpipe).
    #[arg(long)]
    channel_id: Option<String>,
    /// Which answers are deliveries: 2xx (any 2xx; a JSON `code` must be 0), 2xx-and-code, code (add: 2xx).
    #[arg(long, value_parser = |s: &str| SuccessRule::parse("--success", s))]
    success: Option<SuccessRule>,
    /// Free text.
    #[arg(long)]
    description: Option<String>,
    /// Add it disabled.
    #[arg(long)]
    disabled: bool,
    #[command(flatten)]
    output: OutputArg,
}

impl ConsumerArgs {
    fn retry(&self) -> Option<RetryLayer> {
        let layer = RetryLayer {
            profile: self.retry_profile.clone(),
            delays: (!self.retry_delays.is_empty()).then(|| self.retry_delays.clone()),
            jitter: self.retry_jitter,
            ..RetryLayer::default()
        };
        (layer != RetryLayer::default()).then_some(layer)
    }
}

/// Flags of `subs add subscription`.
#[derive(Debug, Args)]
pub struct SubscriptionArgs {
    /// The event's routing key: <db>.<table>.<insert|update|delete> or an order event name.
    #[arg(long)]
    event: String,
    /// The consumer's name.
    #[arg(long)]
    consumer: String,
    /// Bind key (a-z, 0-9, - and _): subscriptions of one consumer with one
    /// bind key share a consumer group, <consumer>.<bind_key>.consumer.
    #[arg(long)]
    bind_key: String,
    /// A filter, all of which must hold (repeatable): FIELD:eq:VALUE,
    /// FIELD:ne:VALUE, FIELD:in:V1,V2, FIELD:changed[:FROM->TO], e.g. status:changed:1->2.
    #[arg(long = "filter")]
    filters: Vec<String>,
    /// Free text.
    #[arg(long)]
    description: Option<String>,
    /// Add it disabled.
    #[arg(long)]
    disabled: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// Flags of `subs update subscription`.
#[derive(Debug, Args)]
pub struct SubscriptionUpdateArgs {
    /// Subscription id.
    id: i64,
    /// A new bind key (moves it to another group, which has its own offsets).
    #[arg(long)]
    bind_key: Option<String>,
    /// Replace the filters with these (repeatable; see `subs add subscription --help`).
    #[arg(long = "filter")]
    filters: Vec<String>,
    /// Remove every filter.
    #[arg(long, conflicts_with = "filters")]
    clear_filters: bool,
    /// Free text.
    #[arg(long)]
    description: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

/// Flags of an event definition.
#[derive(Debug, Args)]
pub struct EventArgs {
    /// Routing key: <db>.<table>.<insert|update|delete> or an order event name.
    routing_key: String,
    /// Topic (add: cdc.<db>.<table> for a CDC routing key, else the order topic).
    #[arg(long)]
    topic: Option<String>,
    /// The source's name (update: "" detaches it).
    #[arg(long)]
    source: Option<String>,
    /// Free text.
    #[arg(long)]
    description: Option<String>,
    /// Columns cdc drops, hashes or masks in this table's rows, as JSON: drop, hash and
    /// mask lists, e.g. '{"hash": ["mobile"]}' (update: the whole set; '{}' clears it). Every
    /// definition of a table carries the same rules or none.
    #[arg(long, value_name = "JSON")]
    redact: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

impl EventArgs {
    /// `--redact`, parsed.
    fn redact(&self) -> anyhow::Result<Option<crate::masking::ColumnRules>> {
        parse_redact(
            self.redact.as_deref(),
            "a JSON object of drop, hash or mask lists, e.g. '{\"hash\": [\"mobile\"]}'",
        )
    }
}

/// Flags of a source.
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Name (a-z, 0-9, - and _).
    name: String,
    /// Host (required by add).
    #[arg(long)]
    host: Option<String>,
    /// Port (add: 3306).
    #[arg(long)]
    port: Option<i32>,
    /// Replication user (required by add).
    #[arg(long)]
    user: Option<String>,
    /// Free text.
    #[arg(long)]
    description: Option<String>,
    /// Columns cdc drops, hashes or masks, as JSON: table -> {drop, hash,
    /// mask} lists, e.g. '{"shop.users": {"hash": ["mobile"]}}' (update: the
    /// whole set; '{}' clears it).
    #[arg(long, value_name = "JSON")]
    redact: Option<String>,
    /// Add it disabled.
    #[arg(long)]
    disabled: bool,
    #[command(flatten)]
    output: OutputArg,
}

impl SourceArgs {
    /// `--redact`, parsed.
    fn redact(&self) -> anyhow::Result<Option<BTreeMap<String, crate::masking::ColumnRules>>> {
        parse_redact(
            self.redact.as_deref(),
            "a JSON object of tables, each with drop, hash or mask lists, \
             e.g. '{\"shop.users\": {\"hash\": [\"mobile\"]}}'",
        )
    }
}

/// `--redact`'s JSON, or what was expected.
fn parse_redact<T: serde::de::DeserializeOwned>(
    text: Option<&str>,
    expected: &str,
) -> anyhow::Result<Option<T>> {
    text.map(|text| {
        serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("--redact: {e}; expected {expected}"))
    })
    .transpose()
}

/// A store error with its field spelled as the flag that sets it.
fn flag_error(e: SubsError) -> anyhow::Error {
    match e {
        SubsError::Invalid(Invalid { field, reason }) => {
            let flag = match field.as_str() {
                "event" | "url" | "method" | "topic" | "source" | "description" | "name"
                | "redact" => {
                    format!("--{field}")
                }
                "db_host" => "--host".into(),
                "db_port" => "--port".into(),
                "db_user" => "--user".into(),
                f if f.starts_with("filters[") => "--filter".into(),
                f => format!("--{}", f.replace(['_', '.'], "-")),
            };
            anyhow::anyhow!("{flag}: {reason}")
        }
        other => other.into(),
    }
}

/// Parses `--filter` texts.
fn filters(texts: &[String]) -> anyhow::Result<Vec<FilterSpec>> {
    texts
        .iter()
        .map(|t| {
            PropertyFilter::parse(t, "--filter")
                .map(|f| FilterSpec::from(&f))
                .map_err(anyhow::Error::from)
        })
        .collect()
}

/// Runs `orderpipe subs ...`.
pub async fn run(settings: &Settings, command: SubsCommand) -> anyhow::Result<ExitCode> {
    let db = Db::connect(&settings.database, 2)?;
    let store = Store::new(db.clone(), Origin::Cli);
    let order_topic = settings.topics.order_events.name.as_str();
    match command {
        SubsCommand::Add(AddCommand::Consumer(a)) => {
            let Some(url) = a.url.clone() else {
                anyhow::bail!("--url: required to add a consumer (an http(s) URL)");
            };
            if a.clear_retry {
                anyhow::bail!("--clear-retry: only for update");
            }
            let new = NewConsumer {
                name: a.name.clone(),
                url,
                method: a.method.clone(),
                timeout_ms: a.timeout_ms,
                retry: a.retry(),
                channel_id: a.channel_id.clone(),
                success: a.success,
                enabled: Some(!a.disabled),
                description: a.description.clone(),
            };
            added::<Consumer>(&store, &new, order_topic, a.output.output).await?;
        }
        SubsCommand::Add(AddCommand::Subscription(a)) => {
            let new = NewSubscription {
                event: a.event,
                consumer: a.consumer,
                bind_key: a.bind_key,
                filters: filters(&a.filters)?,
                enabled: Some(!a.disabled),
                description: a.description,
            };
            added::<Subscription>(&store, &new, order_topic, a.output.output).await?;
        }
        SubsCommand::Add(AddCommand::Event(a)) => {
            let new = NewEvent {
                redact: a.redact()?,
                routing_key: a.routing_key,
                topic: a.topic,
                source: a.source,
                description: a.description,
            };
            added::<EventDefinition>(&store, &new, order_topic, a.output.output).await?;
        }
        SubsCommand::Add(AddCommand::Source(a)) => {
            let redact = a.redact()?;
            let (Some(host), Some(user)) = (a.host, a.user) else {
                anyhow::bail!("--host and --user: both required to add a source");
            };
            let new = NewSource {
                name: a.name,
                db_host: host,
                db_port: a.port,
                db_user: user,
                enabled: Some(!a.disabled),
                description: a.description,
                redact,
            };
            added::<Source>(&store, &new, order_topic, a.output.output).await?;
        }
        SubsCommand::List {
            kind,
            consumer,
            event,
            output,
        } => {
            if kind != Kind::Subscriptions && (consumer.is_some() || event.is_some()) {
                anyhow::bail!("--consumer and --event: only for `subs list subscriptions`");
            }
            match kind {
                Kind::Subscriptions => {
                    let query = SubscriptionQuery {
                        consumer,
                        event,
                        served_only: false,
                    };
                    Subscription::print(&store.list_subscriptions(&query).await?, output.output);
                }
                Kind::Consumers => Consumer::print(&Consumer::list(&store).await?, output.output),
                Kind::Events => {
                    EventDefinition::print(&EventDefinition::list(&store).await?, output.output)
                }
                Kind::Sources => Source::print(&Source::list(&store).await?, output.output),
            }
        }
        SubsCommand::Show { target, output } => {
            target.apply(&store, Action::Show, output.output).await?
        }
        SubsCommand::Update(UpdateCommand::Consumer(a)) => {
            only_for_add(a.disabled, "consumer", &a.name)?;
            let patch = ConsumerPatch {
                url: a.url.clone(),
                method: a.method.clone(),
                timeout_ms: a.timeout_ms,
                retry: a.retry(),
                clear_retry: a.clear_retry,
                channel_id: a.channel_id.clone(),
                success: a.success,
                enabled: None,
                description: a.description.clone(),
            };
            updated::<Consumer>(&store, &a.name, &patch, a.output.output).await?;
        }
        SubsCommand::Update(UpdateCommand::Subscription(a)) => {
            let replaced = match (a.clear_filters, a.filters.is_empty()) {
                (true, _) => Some(Vec::new()),
                (false, false) => Some(filters(&a.filters)?),
                (false, true) => None,
            };
            let patch = SubscriptionPatch {
                bind_key: a.bind_key,
                filters: replaced,
                enabled: None,
                description: a.description,
            };
            updated::<Subscription>(&store, &a.id, &patch, a.output.output).await?;
        }
        SubsCommand::Update(UpdateCommand::Event(a)) => {
            let patch = EventPatch {
                redact: a.redact()?,
                topic: a.topic,
                source: a.source,
                description: a.description,
            };
            updated::<EventDefinition>(&store, &a.routing_key, &patch, a.output.output).await?;
        }
        SubsCommand::Update(UpdateCommand::Source(a)) => {
            only_for_add(a.disabled, "source", &a.name)?;
            let patch = SourcePatch {
                redact: a.redact()?,
                db_host: a.host,
                db_port: a.port,
                db_user: a.user,
                enabled: None,
                description: a.description,
            };
            updated::<Source>(&store, &a.name, &patch, a.output.output).await?;
        }
        SubsCommand::Enable { target, output } => {
            target
                .apply(&store, Action::SetEnabled(true), output.output)
                .await?
        }
        SubsCommand::Disable { target, output } => {
            target
                .apply(&store, Action::SetEnabled(false), output.output)
                .await?
        }
        SubsCommand::Remove { target, output } => {
            target.apply(&store, Action::Remove, output.output).await?
        }
        SubsCommand::Pause {
            target,
            pause,
            output,
        } => {
            let (by, until) = (pause.by(), pause.until_ms());
            let done =
                subscription_pause::pause(&store, &target.parse()?, until, &by, &pause.reason)
                    .await?;
            print_group_actions(&done, output.output, "paused");
        }
        SubsCommand::Resume { target, output } => {
            let done = subscription_pause::resume(&store, &target.parse()?).await?;
            print_group_actions(&done, output.output, "resumed");
        }
        SubsCommand::Bindings { consumer, output } => {
            if let Some(name) = &consumer {
                store.consumer(name).await?;
            }
            print_bindings(&store.desired(consumer.as_deref()).await?, output.output);
        }
        SubsCommand::Reconcile { dry_run, output } => {
            return super::router::reconcile(settings, &store, dry_run, output.output).await;
        }
        SubsCommand::Refresh { consumer, output } => {
            request(&store, RequestKind::Refresh, consumer, output.output).await?
        }
        SubsCommand::Reload { consumer, output } => {
            request(&store, RequestKind::Reload, consumer, output.output).await?
        }
        SubsCommand::Serve { addr, migrate } => {
            super::signals::install()?;
            if migrate {
                db.migrate().await?;
            }
            let addr = match addr {
                Some(a) => a,
                None => settings.admin.listen.parse()?,
            };
            let state = AdminState::new(db.clone(), order_topic, settings.admin.token.as_ref());
            if settings.admin.token.is_none() {
                eprintln!(
                    "admin.token is not set: the admin API is read-only (set ORDERPIPE_ADMIN__TOKEN)"
                );
            }
            let health = HealthState::service();
            crate::health::watch_db(db, health.clone());
            admin::serve(
                addr,
                state,
                health,
                |bound| eprintln!("admin API listening on http://{bound}"),
                shutdown_signal(),
            )
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `subs pause|resume` did, group by group.
fn print_group_actions(done: &[GroupAction], format: Output, verb: &str) {
    if format == Output::Json {
        return output::json(&json!({ verb: done }));
    }
    if done.is_empty() {
        println!("no group serves it (it has no subscription): nothing {verb}");
        return;
    }
    let rows = done.iter().map(|a| {
        let ids: Vec<String> = a.subscriptions.iter().map(|id| format!("#{id}")).collect();
        let state = match (&a.pause, a.was_paused) {
            (Some(p), _) => match p.until_ms {
                Some(until) => format!("paused until {}", utc(until)),
                None => "paused until resumed".into(),
            },
            (None, true) => "resumed: delivers on in order within a second".into(),
            (None, false) => "was not paused".into(),
        };
        vec![a.group.clone(), ids.join(" "), state]
    });
    println!(
        "{}",
        output::table(&["group", "subscriptions held by it", "now"], rows)
    );
}

/// `--disabled` given to an update: refused, pointing at `subs disable`
/// (enabling and disabling are commands of their own).
fn only_for_add(disabled: bool, kind: &str, name: &str) -> anyhow::Result<()> {
    if disabled {
        anyhow::bail!("--disabled: only for add; use `subs disable {kind} {name}`");
    }
    Ok(())
}

/// What `show`, `enable`, `disable` and `remove` do to a [`Target`].
#[derive(Debug, Clone, Copy)]
enum Action {
    Show,
    SetEnabled(bool),
    Remove,
}

impl Target {
    /// Does `action` to the record, whatever its kind.
    async fn apply(&self, store: &Store, action: Action, format: Output) -> anyhow::Result<()> {
        match self.kind {
            TargetKind::Consumer => apply::<Consumer>(store, &self.key, action, format).await,
            TargetKind::Subscription => {
                apply::<Subscription>(store, &self.key, action, format).await
            }
            TargetKind::Event => apply::<EventDefinition>(store, &self.key, action, format).await,
            TargetKind::Source => apply::<Source>(store, &self.key, action, format).await,
        }
    }
}

/// [`Target::apply`] for one kind; `key` as typed (only an id can fail to parse).
async fn apply<R: Printed>(
    store: &Store,
    key: &str,
    action: Action,
    format: Output,
) -> anyhow::Result<()> {
    let kind = R::KIND;
    let parsed = R::parse_key(key).map_err(|_| {
        anyhow::anyhow!("{kind}: `{key}` is not a {kind} id (a number; see `subs list`)")
    })?;
    match action {
        Action::Show => show(&R::get(store, &parsed).await?, format),
        Action::SetEnabled(enabled) => {
            let Some(patch) = R::enabled_patch(enabled) else {
                anyhow::bail!(
                    "{kind}: {kind}s have no enabled flag; enable or disable the subscriptions or consumers that name it (accepted: consumer, subscription, source)"
                )
            };
            R::print(&[R::update(store, &parsed, &patch).await?], format);
        }
        Action::Remove => {
            let removed = R::remove(store, &parsed).await?;
            match format {
                Output::Json => output::json(&json!({"removed": removed})),
                Output::Table => println!("removed {kind} {key}"),
            }
        }
    }
    Ok(())
}

/// Adds a record from its flags and prints it (errors name the flag).
async fn added<R: Printed>(
    store: &Store,
    new: &R::New,
    order_topic: &str,
    format: Output,
) -> anyhow::Result<()> {
    let record = R::add(store, new, order_topic).await.map_err(flag_error)?;
    R::print(&[record], format);
    Ok(())
}

/// Changes a record from its flags and prints it (errors name the flag).
async fn updated<R: Printed>(
    store: &Store,
    key: &R::Key,
    patch: &R::Patch,
    format: Output,
) -> anyhow::Result<()> {
    let record = R::update(store, key, patch).await.map_err(flag_error)?;
    R::print(&[record], format);
    Ok(())
}

async fn request(
    store: &Store,
    kind: RequestKind,
    consumer: Option<String>,
    format: Output,
) -> anyhow::Result<()> {
    let request = store.request(kind, consumer.as_deref()).await?;
    match format {
        Output::Json => output::json(&request),
        Output::Table => println!(
            "{} request {} written for {}: routers act on it at their next poll",
            serde_json::to_value(request.kind)?
                .as_str()
                .unwrap_or_default(),
            request.id,
            consumer.map_or("every consumer".to_string(), |c| format!("consumer {c}"))
        ),
    }
    Ok(())
}

fn yes_no(b: bool) -> String {
    if b { "yes".into() } else { "no".into() }
}

/// Filters as the CLI writes them, joined by ` AND ` (all must hold).
fn filters_cli(filters: &[PropertyFilter]) -> String {
    filters
        .iter()
        .map(PropertyFilter::to_cli)
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// A kind of record as `subs` prints a list of it: a table, or the records as JSON.
trait Printed: Record {
    /// Prints `records` in `format`.
    fn print(records: &[Self], format: Output);
}

impl Printed for Consumer {
    fn print(consumers: &[Self], format: Output) {
        let header = [
            "consumer",
            "method",
            "url",
            "timeout ms",
            "retry",
            "channel",
            "success",
            "enabled",
        ];
        output::print_list(consumers, format, &header, |c| {
            vec![
                c.name.clone(),
                c.method.clone(),
                c.url.clone(),
                c.timeout_ms.to_string(),
                c.retry.as_ref().map_or("([retry])".into(), |r| {
                    serde_json::to_string(r).unwrap_or_default()
                }),
                c.channel_id.clone(),
                c.success.as_str().into(),
                yes_no(c.enabled),
            ]
        });
    }
}

impl Printed for Subscription {
    fn print(subscriptions: &[Self], format: Output) {
        let header = [
            "id", "event", "consumer", "bind key", "group", "enabled", "filters",
        ];
        output::print_list(subscriptions, format, &header, |s| {
            vec![
                s.id.to_string(),
                s.event.clone(),
                s.consumer.clone(),
                s.bind_key.clone(),
                s.group.clone(),
                yes_no(s.enabled),
                filters_cli(&s.filters),
            ]
        });
    }
}

impl Printed for EventDefinition {
    fn print(events: &[Self], format: Output) {
        let header = ["event", "topic", "source", "redact", "description"];
        output::print_list(events, format, &header, |e| {
            vec![
                e.routing_key.clone(),
                e.topic.clone(),
                e.source.clone().unwrap_or_default(),
                rules_text(&e.redact),
                e.description.clone(),
            ]
        });
    }
}

impl Printed for Source {
    fn print(sources: &[Self], format: Output) {
        let header = ["source", "host", "user", "enabled", "redact", "description"];
        output::print_list(sources, format, &header, |s| {
            // `shop.users: hash mobile; drop id_card`, one table after another.
            let redact: Vec<String> = s
                .redact
                .iter()
                .map(|(table, r)| format!("{table}: {}", rules_text(r)))
                .collect();
            vec![
                s.name.clone(),
                format!("{}:{}", s.db_host, s.db_port),
                s.db_user.clone(),
                yes_no(s.enabled),
                redact.join(" | "),
                s.description.clone(),
            ]
        });
    }
}

/// One table's rules as `hash mobile; drop id_card` (empty: none).
fn rules_text(rules: &crate::masking::ColumnRules) -> String {
    [
        ("drop", &rules.drop),
        ("hash", &rules.hash),
        ("mask", &rules.mask),
    ]
    .into_iter()
    .filter(|(_, columns)| !columns.is_empty())
    .map(|(action, columns)| format!("{action} {}", columns.join(",")))
    .collect::<Vec<_>>()
    .join("; ")
}

fn print_bindings(bindings: &[Binding], format: Output) {
    // An empty table says nothing to someone wondering why no group runs.
    if format == Output::Table && bindings.is_empty() {
        println!("no enabled subscription of an enabled consumer: no group to run");
        return;
    }
    let header = ["group", "url", "topics", "subscriptions"];
    output::print_list(bindings, format, &header, |b| {
        let routes = b
            .routes
            .iter()
            .map(|r| {
                let filters = filters_cli(&r.filters);
                match filters.is_empty() {
                    true => format!("#{} {}", r.subscription_id, r.routing_key),
                    false => format!("#{} {} if {filters}", r.subscription_id, r.routing_key),
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        vec![
            b.group.clone(),
            b.consumer.url.clone(),
            b.topics.join("\n"),
            routes,
        ]
    });
}

/// One record as a two-column table of its JSON fields.
fn show(record: &impl serde::Serialize, format: Output) {
    if format == Output::Json {
        return output::json(record);
    }
    let value = serde_json::to_value(record).unwrap_or_default();
    let rows = value.as_object().into_iter().flatten().map(|(k, v)| {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            serde_json::Value::Array(items) if k == "filters" => filters_cli(
                &items
                    .iter()
                    .filter_map(|f| serde_json::from_value::<FilterSpec>(f.clone()).ok())
                    .filter_map(|spec| spec.check("filters").ok())
                    .collect::<Vec<_>>(),
            ),
            other => other.to_string(),
        };
        vec![k.clone(), text]
    });
    println!("{}", output::table(&["field", "value"], rows));
}
