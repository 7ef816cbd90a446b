//! JetStream messages per followup: every stream's last sequence before and after a load (the event
//! streams, the KV buckets' streams such as `KV_turnstile_index`), for the capacity model's "messages per
//! followup" and the index puts per followup (decision 0177) measured rather than estimated.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;

/// Each stream's last sequence now, by name.
pub async fn last_seqs(nats: &async_nats::Client) -> Result<BTreeMap<String, u64>> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut streams = js.streams();
    let mut out = BTreeMap::new();
    while let Some(info) = streams.try_next().await.context("listing the JetStream streams")? {
        out.insert(info.config.name.clone(), info.state.last_sequence);
    }
    Ok(out)
}

/// Messages each stream took per followup between `before` and `after` (a stream created in between
/// counts from 0; streams that took none are left out), and their sum under `"total"`.
pub fn per_followup(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    followups: usize,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if followups == 0 {
        return out;
    }
    for (name, last) in after {
        let added = last.saturating_sub(before.get(name).copied().unwrap_or(0));
        if added > 0 {
            out.insert(name.clone(), added as f64 / followups as f64);
        }
    }
    let total = out.values().sum();
    out.insert("total".to_owned(), total);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_per_followup_by_stream() {
        let before: BTreeMap<String, u64> = [("EV_0".into(), 100), ("KV_turnstile_index".into(), 50)].into();
        let after: BTreeMap<String, u64> =
            [("EV_0".into(), 3_100), ("KV_turnstile_index".into(), 550), ("KV_new".into(), 10), ("IDLE".into(), 0)]
                .into();
        let per = per_followup(&before, &after, 1_000);
        assert_eq!(per["EV_0"], 3.0);
        assert_eq!(per["KV_turnstile_index"], 0.5);
        assert_eq!(per["KV_new"], 0.01);
        assert!(!per.contains_key("IDLE"));
        assert!((per["total"] - 3.51).abs() < 1e-9);
        assert!(per_followup(&before, &after, 0).is_empty());
    }
}
