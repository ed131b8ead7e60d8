//! How a page shows the fields of `console.masked_fields`
//! ([`crate::masking`]): as `•••` to everyone, unless an operator reveals
//! them on that page (`?reveal=1`), which writes a `reveal` audit row. A
//! viewer asking to reveal gets 403.

use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{Principal, Role};
use super::{ConsoleError, ConsoleState, audit};
use crate::masking::FieldMask;

/// `?reveal=1` of the pages that show decoded records.
#[derive(Debug, Default, Deserialize)]
pub struct RevealQuery {
    /// `1`: show the masked fields (an operator's, audited).
    #[serde(default)]
    pub reveal: Option<String>,
}

/// What a page masks, and the notice it shows about it.
#[derive(Debug, Default)]
pub struct Masking {
    mask: Option<FieldMask>,
    /// The notice (none when nothing is configured to be masked).
    pub notice: Option<Notice>,
}

/// The line a page shows above its records.
#[derive(Debug)]
pub struct Notice {
    /// The masked paths, comma-separated.
    pub fields: String,
    /// Whether they are shown on this page (an operator revealed them).
    pub revealed: bool,
    /// This page with `reveal=1`.
    pub reveal_href: String,
}

impl Masking {
    /// The masking of the page at `uri` for `principal`, who asked to
    /// reveal when `reveal` is `1`: refused to a viewer, audited for an operator.
    pub async fn of(
        state: &ConsoleState,
        principal: &Principal,
        uri: &axum::http::Uri,
        reveal: Option<&str>,
    ) -> Result<Self, ConsoleError> {
        let mask = state.field_mask();
        if mask.is_empty() {
            return Ok(Self::default());
        }
        let fields = state.settings().console.masked_fields.join(", ");
        let page = uri.to_string();
        let revealed = reveal == Some("1");
        if revealed {
            if principal.role != Role::Operator {
                return Err(ConsoleError::Forbidden(
                    "only an operator may reveal masked fields".into(),
                ));
            }
            let target = json!({"page": page, "fields": state.settings().console.masked_fields});
            audit::record(
                state.db(),
                principal,
                "reveal",
                &target,
                1,
                "masked fields shown",
            )
            .await?;
        }
        let separator = if uri.query().is_some() { '&' } else { '?' };
        Ok(Self {
            mask: (!revealed).then(|| mask.clone()),
            notice: Some(Notice {
                fields,
                revealed,
                reveal_href: format!("{page}{separator}reveal=1"),
            }),
        })
    }

    /// An explorer record view (`{"decoded": {"json": <record>}, ...}`) as
    /// this page shows it.
    pub fn apply_to_view(&self, mut view: Value) -> Value {
        if let Some(mask) = &self.mask {
            mask.apply_under(&mut view, crate::masking::RECORD_VIEW_JSON);
        }
        view
    }

    /// `value` as this page shows it.
    pub fn apply(&self, value: Value) -> Value {
        match &self.mask {
            Some(mask) => mask.masked(value),
            None => value,
        }
    }
}
