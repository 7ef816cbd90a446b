//! Arbitrary values for every known key of the scalar tables (issue 14 part 6): the parser accepts the
//! value or refuses it with [`ConfigError::Invalid`] naming exactly that key, never a panic and never an
//! error about some other key.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use turnstile_config::{Config, ConfigError};

/// Modest and deterministic enough for CI: no persistence file is written into the tree.
fn config() -> ProptestConfig {
    ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }
}

/// Every key of the tables whose keys all have defaults (docs/CONFIGURATION.md), so one key alone is a
/// complete configuration.
const KEYS: &[(&str, &[&str])] = &[
    (
        "limits",
        &[
            "max_message_bytes",
            "max_pending",
            "max_pending_bytes",
            "when_idle_timeout_ms",
            "max_goal_rounds",
            "max_queued_commands",
            "tenant_requests_per_minute",
            "tenant_request_burst",
            "tenant_max_watches",
            "watch_buffer_bytes",
            "watch_buffer_total_bytes",
            "max_spawn_depth",
            "max_children",
        ],
    ),
    (
        "cluster",
        &[
            "shards",
            "partitions",
            "replicas",
            "lease_ttl_ms",
            "renew_ms",
            "worker_ttl_ms",
            "drain_timeout_ms",
            "route_deadline_ms",
        ],
    ),
    ("journal", &["snapshot_every", "passivate_after_ms", "dedup_horizon", "max_age_ms", "max_bytes"]),
    ("tools", &["deadline_ms"]),
];

/// A TOML value of any type, numbers at and around the edges included.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(i64::MAX), Just(i64::MIN), Just(u32::MAX as i64 + 1)]
            .prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        Just("inf".to_owned()),
        Just("nan".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        "[a-z0-9 ._-]{0,12}".prop_map(|s| format!("\"{s}\"")),
        Just("1979-05-27T07:32:00Z".to_owned()),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(", "))),
            proptest::collection::vec(inner, 0..3).prop_map(|items| {
                let fields: Vec<String> = items.iter().enumerate().map(|(i, v)| format!("k{i} = {v}")).collect();
                format!("{{ {} }}", fields.join(", "))
            }),
        ]
    })
}

fn key() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select(KEYS.iter().flat_map(|(table, keys)| keys.iter().map(|k| (*table, *k))).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn an_arbitrary_value_of_a_known_key_is_accepted_or_refused_naming_the_key(
        (table, key) in key(),
        value in value(),
    ) {
        let text = format!("[{table}]\n{key} = {value}\n");
        match Config::from_toml_str(&text) {
            Ok(config) => prop_assert!(config.validate().is_ok(), "accepted {text:?} but validate refuses it"),
            Err(ConfigError::Invalid { key: named, message, .. }) => {
                let full = format!("{table}.{key}");
                // A cross-key rule (renew_ms < lease_ttl_ms, ...) may name both keys; it names this one.
                prop_assert!(
                    named.starts_with(&full) || message.contains(key),
                    "{text:?}: the refusal names {named:?} ({message})"
                );
                prop_assert!(!message.is_empty());
            }
            Err(other) => prop_assert!(false, "{text:?}: not a key refusal: {other:?}"),
        }
    }
}
