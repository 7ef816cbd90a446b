//! Token usage counted per tenant, UTC day and model (SPEC §17): the pure part that both journals share.
//!
//! What is counted is exactly the usage recorded on durable `assistant/message` events, and on the
//! `step/end` of a request that did not finish ([`counted`]): a
//! step retried after a failover is counted once per message that was written, never per attempt. A
//! [`UsageBook`] holds one tenant's counts by day (days since the Unix epoch, UTC, from the event's own
//! `time_ms`, so every node that counts an event puts it on the same day) and by model (`provider/model`).
//!
//! ```
//! use turnstile_model::usage::{UsageBook, DAY_MS, model_key};
//! use turnstile_model::{ModelRef, Usage};
//!
//! let mut book = UsageBook::default();
//! let claude = model_key(Some(&ModelRef::new("anthropic", "claude")));
//! book.count(3, &claude, &Usage { input_tokens: 100, output_tokens: 20, cached_input_tokens: 80, ..Usage::default() });
//! book.count(4, &claude, &Usage { input_tokens: 10, output_tokens: 2, ..Usage::default() });
//! assert_eq!(book.used_on(4), 12);
//! assert_eq!(book.per_model_since(3)[&claude].cached_input_tokens, 80);
//! assert_eq!(book.per_model_since(4)[&claude].input_tokens, 10);
//! assert_eq!(turnstile_model::usage::day_start_ms(4), 4 * DAY_MS);
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::{Envelope, EventPayload, ModelRef, Usage};

/// Milliseconds in a UTC day.
pub const DAY_MS: u64 = 86_400_000;

/// Days a [`UsageBook`] keeps ([`UsageBook::prune`]): `GetUsage` reaches back that far.
pub const KEPT_DAYS: u64 = 400;

/// The model key of usage recorded without a model (messages written before SPEC §17).
pub const UNKNOWN_MODEL: &str = "unknown";

/// The UTC day (days since the Unix epoch) of `time_ms`.
pub fn day_of(time_ms: u64) -> u64 {
    time_ms / DAY_MS
}

/// When UTC day `day` starts, in ms since the Unix epoch.
pub fn day_start_ms(day: u64) -> u64 {
    day.saturating_mul(DAY_MS)
}

/// How usage is keyed by model: `provider/model`, or [`UNKNOWN_MODEL`].
pub fn model_key(model: Option<&ModelRef>) -> String {
    match model {
        Some(m) => format!("{}/{}", m.provider, m.model),
        None => UNKNOWN_MODEL.to_owned(),
    }
}

/// The provider and model of a [`model_key`] (the provider never holds a `/`; a model name may).
pub fn split_model_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// What `event` adds to its tenant's usage: the day, the model key and the usage of an `assistant/message`
/// that recorded one, or of a `step/end` that recorded what an unfinished request spent (decision 0086);
/// `None` for every other event. A step records its usage on one of the two, never both.
pub fn counted(event: &Envelope) -> Option<(u64, String, Usage)> {
    match &event.payload {
        EventPayload::AssistantMessage { usage: Some(usage), model, .. } => {
            Some((day_of(event.time_ms), model_key(model.as_ref()), *usage))
        }
        EventPayload::StepEnd { spent: Some(spent), .. } => {
            Some((day_of(event.time_ms), model_key(spent.model.as_ref()), spent.usage))
        }
        _ => None,
    }
}

impl Usage {
    /// Adds `other`'s counts to these (saturating: a corrupt count cannot wrap a total).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(other.cached_input_tokens);
        self.cache_write_tokens = self.cache_write_tokens.saturating_add(other.cache_write_tokens);
    }
}

/// One tenant's token usage by UTC day and model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageBook {
    /// Day → model key → tokens.
    pub days: BTreeMap<u64, BTreeMap<String, Usage>>,
}

impl UsageBook {
    /// Adds `usage` of `model` on `day`.
    pub fn count(&mut self, day: u64, model: &str, usage: &Usage) {
        self.days.entry(day).or_default().entry(model.to_owned()).or_default().add(usage);
    }

    /// Adds the usage `event` records, if any ([`counted`]).
    pub fn count_event(&mut self, event: &Envelope) {
        if let Some((day, model, usage)) = counted(event) {
            self.count(day, &model, &usage);
        }
    }

    /// Input plus output tokens of every model on `day`: what `token_budget` is checked against.
    pub fn used_on(&self, day: u64) -> u64 {
        self.days.get(&day).map_or(0, |models| models.values().map(Usage::total).fold(0, u64::saturating_add))
    }

    /// Tokens per model key over the days from `since_day` on.
    pub fn per_model_since(&self, since_day: u64) -> BTreeMap<String, Usage> {
        let mut out: BTreeMap<String, Usage> = BTreeMap::new();
        for models in self.days.range(since_day..).map(|(_, m)| m) {
            for (model, usage) in models {
                out.entry(model.clone()).or_default().add(usage);
            }
        }
        out
    }

    /// Only the days from `since_day` on.
    pub fn since(&self, since_day: u64) -> UsageBook {
        UsageBook { days: self.days.range(since_day..).map(|(d, m)| (*d, m.clone())).collect() }
    }

    /// Forgets the days more than [`KEPT_DAYS`] before `today`, so a book stays small.
    pub fn prune(&mut self, today: u64) {
        let keep_from = today.saturating_sub(KEPT_DAYS);
        self.days = self.days.split_off(&keep_from);
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &UsageBook) {
        for (day, models) in &other.days {
            for (model, usage) in models {
                self.count(*day, model, usage);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::SessionRef;

    fn message(time_ms: u64, usage: Option<Usage>, model: Option<ModelRef>) -> Envelope {
        let mut payload = EventPayload::reply(1, 1, "hi");
        if let EventPayload::AssistantMessage { usage: u, model: m, .. } = &mut payload {
            (*u, *m) = (usage, model);
        }
        Envelope { session: SessionRef::new("acme", "s").unwrap(), seq: 1, time_ms, epoch: 1, payload }
    }

    #[test]
    fn only_assistant_messages_with_usage_count_on_their_own_day() {
        let usage = Usage { input_tokens: 5, output_tokens: 1, ..Usage::default() };
        let mut book = UsageBook::default();
        book.count_event(&message(DAY_MS + 5, Some(usage), Some(ModelRef::new("openai", "gpt/4"))));
        book.count_event(&message(DAY_MS + 6, None, None));
        book.count_event(&message(2 * DAY_MS, Some(usage), None));
        assert_eq!(book.used_on(1), 6);
        assert_eq!(book.used_on(2), 6);
        assert_eq!(book.per_model_since(0).keys().collect::<Vec<_>>(), ["openai/gpt/4", UNKNOWN_MODEL]);
        assert_eq!(split_model_key("openai/gpt/4"), ("openai", "gpt/4"));
        assert_eq!(book.since(2).days.len(), 1);
    }

    #[test]
    fn pruning_keeps_the_recent_days() {
        let mut book = UsageBook::default();
        for day in [1, 500, 900] {
            book.count(day, "m", &Usage { input_tokens: 1, ..Usage::default() });
        }
        book.prune(901);
        assert_eq!(book.days.keys().copied().collect::<Vec<_>>(), [900]);
        let json = serde_json::to_string(&book).unwrap();
        assert_eq!(serde_json::from_str::<UsageBook>(&json).unwrap(), book);
    }
}
