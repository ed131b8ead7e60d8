//! The decode stage ([`Decoder`]): a record's bytes to a checked
//! [`Envelope`], or poison with the reason to dead-letter it with (no
//! retry can fix it). The registry being down is waited out in place.

use std::sync::Arc;

use crate::kafka::consumed::ConsumedRecord;
use rdkafka::Message;

use super::state::{At, PartitionState, Revoked};
use crate::backoff::{retry, until_available};
use crate::consumer::events::ProcessingFailed;
use crate::consumer::version::{self, UNSUPPORTED_VERSION};
use crate::envelope::Envelope;
use crate::kafka::record::Failure;
use crate::metrics::InternalEvent;

/// Largest record value accepted (order events are small by rule).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// What decoding a record gave.
// Envelope is the common case: boxing it would allocate once per record for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Decoded {
    /// The envelope, checked.
    Envelope(Envelope),
    /// Poison: the failure to dead-letter it with.
    Poison(Failure),
}

/// Decodes and checks the records of one partition.
pub(super) struct Decoder {
    state: Arc<PartitionState>,
}

impl Decoder {
    pub(super) fn new(state: Arc<PartitionState>) -> Self {
        Self { state }
    }

    /// Decodes and checks one record, waiting in place while the registry
    /// is unavailable.
    pub(super) async fn decode(&self, message: &ConsumedRecord) -> Result<Decoded, Revoked> {
        let state = &self.state;
        let payload = message.payload();
        let checked = if payload.is_some_and(|p| p.len() > MAX_VALUE_BYTES) {
            Err((
                "oversized",
                format!(
                    "value of {} bytes exceeds the {MAX_VALUE_BYTES}-byte limit for an order event",
                    payload.map_or(0, <[u8]>::len)
                ),
            ))
        } else {
            let decode = || async {
                match state.shared.codec.decode(payload).await {
                    Ok(envelope) => Ok(check_key(message, envelope).and_then(|envelope| {
                        version::check(&envelope, &state.shared.options.handlers)
                            .map(|()| envelope)
                            .map_err(|why| (UNSUPPORTED_VERSION, why))
                    })),
                    Err(e) if e.is_retryable() => Err(e),
                    Err(e) => Ok(Err((e.class(), e.to_string()))),
                }
            };
            let what = At {
                offset: Some(message.offset()),
                ..state.at("registry unavailable")
            };
            until_available(what, decode, retry, || state.still_owned()).await?
        };
        Ok(match checked {
            Ok(envelope) => Decoded::Envelope(envelope),
            Err((class, reason)) => Decoded::Poison(self.poison(message, class, reason)),
        })
    }

    /// Logs and counts a poison record; the failure to dead-letter it with.
    fn poison(&self, message: &ConsumedRecord, class: &'static str, reason: String) -> Failure {
        let state = &self.state;
        let _in_record = state.span(message, None).entered();
        state.count(|s| {
            s.decode_failures += 1;
            s.unsupported_versions += u64::from(class == UNSUPPORTED_VERSION);
        });
        ProcessingFailed {
            group: &state.shared.options.group,
            event_name: "unknown",
            class,
            error: &reason,
        }
        .emit();
        tracing::error!(topic = %state.key.0, partition = state.key.1, offset = message.offset(), class, error = %reason,
            "poison record: sending to the dead-letter topic");
        Failure {
            class: class.to_string(),
            message: reason,
            retryable: false,
            executions: 0,
            retry_after: None,
        }
    }
}

/// Order events are keyed by order id: a record without that key would
/// break per-order ordering, so it is refused.
fn check_key(
    message: &ConsumedRecord,
    envelope: Envelope,
) -> Result<Envelope, (&'static str, String)> {
    let want = envelope.key();
    match message.key() {
        None => Err((
            "invalid_key",
            format!("record has no key; order events are keyed by order_id ({want})"),
        )),
        Some(k) if k != want.as_bytes() => Err((
            "invalid_key",
            format!(
                "record key `{}` is not the order_id {want}",
                String::from_utf8_lossy(k)
            ),
        )),
        Some(_) => Ok(envelope),
    }
}
