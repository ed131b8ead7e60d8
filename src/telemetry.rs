//! Logging and tracing, set up once per process: human-readable text by
//! default, one JSON object per line with `--log-format json`, and (built
//! with `--features otlp`, enabled with `--otlp-endpoint`) the spans exported
//! to an OpenTelemetry collector over OTLP/HTTP. Logs go to stderr so stdout
//! stays clean for command output (tables, JSON summaries).

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// Installs the global subscriber. `RUST_LOG` wins over `default_level`.
/// `otlp_endpoint` (e.g. `http://collector:4318/v1/traces`) exports spans.
pub fn init(
    format: LogFormat,
    default_level: &str,
    otlp_endpoint: Option<&str>,
) -> Result<(), TelemetryError> {
    // Exported spans need orderpipe's info-level record spans, so with OTLP
    // on, orderpipe logs at info at least.
    let level = match otlp_endpoint {
        Some(_) => format!("{default_level},orderpipe=info"),
        None => default_level.to_string(),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        // Colours only for a person at a terminal: a log file or a pod's
        // log keeps no escape codes to grep around.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(logs).with(filter);
    match otlp_endpoint {
        None => {
            // A second init (tests) keeps the first subscriber.
            let _ = registry.try_init();
            Ok(())
        }
        Some(endpoint) => otlp::init(registry, endpoint),
    }
}

/// Makes `span` a child of the W3C `traceparent` a record carries, so one
/// trace shows the API call, the relay and the consumer. A no-op without
/// OTLP export or without a valid header (the span keeps a trace of its own);
/// `traceparent` is only read when spans are exported.
pub fn continue_trace(span: &tracing::Span, traceparent: impl FnOnce() -> Option<String>) {
    if otlp::exporting()
        && let Some(traceparent) = traceparent()
    {
        otlp::continue_trace(span, &traceparent);
    }
}

/// Whether this process exports spans over OTLP.
pub fn exporting() -> bool {
    otlp::exporting()
}

/// Flushes exported spans; call before the process exits.
pub fn shutdown() {
    otlp::shutdown();
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider;
    use opentelemetry_otlp::WithExportConfig;
    use tracing_subscriber::util::SubscriberInitExt;

    use super::TelemetryError;

    /// Kept to flush the batch exporter at exit.
    static PROVIDER: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> =
        std::sync::OnceLock::new();

    /// Sends what the batch exporter still holds.
    pub fn shutdown() {
        if let Some(provider) = PROVIDER.get() {
            if let Err(e) = provider.shutdown() {
                eprintln!("telemetry: flushing spans failed: {e}");
            }
        }
    }

    /// Whether spans are exported (OTLP set up in this process).
    pub fn exporting() -> bool {
        PROVIDER.get().is_some()
    }

    pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        let carrier =
            std::collections::HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
        let parent =
            opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        if parent.span().span_context().is_valid() {
            // Err only when the span is disabled by the log filter.
            let _ = span.set_parent(parent);
        }
    }

    pub fn init<S>(registry: S, endpoint: &str) -> Result<(), TelemetryError>
    where
        S: tracing::Subscriber
            + for<'a> tracing_subscriber::registry::LookupSpan<'a>
            + Send
            + Sync
            + 'static,
        S: tracing_subscriber::layer::SubscriberExt,
    {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| TelemetryError(format!("OTLP exporter for {endpoint}: {e}")))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("orderpipe")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("orderpipe");
        let _ = PROVIDER.set(provider);
        let _ = registry
            .with(tracing_opentelemetry::layer().with_tracer(tracer))
            .try_init();
        Ok(())
    }
}

#[cfg(not(feature = "otlp"))]
mod otlp {
    use super::TelemetryError;

    pub fn shutdown() {}

    pub fn exporting() -> bool {
        false
    }

    pub fn continue_trace(_: &tracing::Span, _: &str) {}

    pub fn init<S>(_: S, endpoint: &str) -> Result<(), TelemetryError> {
        Err(TelemetryError(format!(
            "--otlp-endpoint {endpoint}: this orderpipe was built without OTLP export; rebuild with `cargo build --features otlp`"
        )))
    }
}
