//! No text panics the parser, every refusal names a key or a TOML position, and a configuration the parser
//! accepts also passes `validate`.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use turnstile_config::{Config, ConfigError};

/// Parses `text`; checks what every outcome must satisfy and returns the message of a refusal.
fn parse(text: &str) -> Option<String> {
    match Config::from_toml_str(text) {
        Ok(config) => {
            if let Err(err) = config.validate() {
                panic!("accepted {text:?} but validate refuses it: {err}");
            }
            assert!(config.agents.contains_key(&config.default_agent));
            None
        }
        Err(err) => {
            let message = err.to_string();
            match &err {
                ConfigError::Syntax { location, .. } => assert!(location.position.is_some(), "{message}"),
                ConfigError::Invalid { key, .. } => assert!(!key.is_empty(), "{message}"),
                other => panic!("unexpected error from text: {other:?}"),
            }
            Some(message)
        }
    }
}

const HEADERS: &[&str] = &[
    "",
    "[limits]",
    "[cluster]",
    "[journal]",
    "[tools]",
    "[models.local]",
    "[models.scripted]",
    "[mcp.files]",
    "[mcp.web]",
    "[agents.assistant]",
    "[agents.scripted]",
    "[[agents.assistant.hooks]]",
    "[agents]",
    "[models]",
    "[[mcp]]",
];

const KEYS: &[&str] = &[
    "default_agent",
    "max_message_bytes",
    "max_pending",
    "when_idle_timeout_ms",
    "max_goal_rounds",
    "max_spawn_depth",
    "max_children",
    "shards",
    "partitions",
    "replicas",
    "lease_ttl_ms",
    "renew_ms",
    "worker_ttl_ms",
    "snapshot_every",
    "dedup_horizon",
    "deadline_ms",
    "provider",
    "base_url",
    "model",
    "api_key_env",
    "max_tokens",
    "timeout_ms",
    "first_byte_timeout_ms",
    "retries",
    "command",
    "args",
    "env",
    "url",
    "headers_env",
    "tool_deadline_ms",
    "system",
    "tools",
    "approval",
    "history_turns",
    "hooks",
    "on_failure",
    "compaction_model",
    "context_budget_tokens",
    "mcp.files.command",
    "agents.x.model",
    "unknown",
];

const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "3",
    "400",
    "1500",
    "10000",
    "99999999999999999999",
    "1.5",
    "true",
    "\"\"",
    "\"assistant\"",
    "\"scripted\"",
    "\"local\"",
    "\"openai\"",
    "\"anthropic\"",
    "\"foo\"",
    "\"error\"",
    "\"skip\"",
    "\"http://127.0.0.1:8080/v1\"",
    "\"https://x/mcp\"",
    "\"127.0.0.1:8080\"",
    "\"OPENAI_API_KEY\"",
    "\"python3\"",
    "[]",
    "[\"clock\", \"echo\"]",
    "[\"mcp:files/*\", \"client:lookup\"]",
    "[\"mcp:files/write_*\"]",
    "[\"mcp:web/*\", \"sleep\"]",
    "[\"goal_complete\"]",
    "[1, 2]",
    "{}",
    "{ Authorization = \"TOKEN\" }",
    "[{ url = \"http://127.0.0.1:7700\" }]",
    "[{ url = \"http://127.0.0.1:7700\", deadline_ms = 0, on_failure = \"reject\" }]",
    "1979-05-27T07:32:00Z",
];

fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (prop::sample::select(KEYS), prop::sample::select(VALUES)).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop::sample::select(HEADERS).prop_map(str::to_owned),
        1 => "[ -~]{0,20}",
    ]
}

/// Values that must never appear in an error: credentials written where a variable name, a URL or a
/// number belongs.
const SECRET: &str = "s3cr3t-Kx9";

fn secret_line() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        format!("api_key_env = \"{SECRET}\""),
        format!("api_key_env = \"sk {SECRET}\""),
        format!("base_url = \"https://user:{SECRET}@api.example/v1\""),
        format!("base_url = \"{SECRET}\""),
        format!("base_url = \"http://host/{SECRET} x\""),
        format!("retries = \"{SECRET}\""),
        format!("max_tokens = \"{SECRET}\""),
    ])
}

proptest! {
    // No persistence file is written into the tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        parse(&text);
    }

    #[test]
    fn arbitrary_printable_text_never_panics(text in "[ -~\\n\\t]{0,200}") {
        parse(&text);
    }

    #[test]
    fn configuration_shaped_text_never_panics(lines in prop::collection::vec(line(), 0..24)) {
        parse(&lines.join("\n"));
    }

    #[test]
    fn secrets_in_the_wrong_place_are_never_repeated(
        before in prop::collection::vec(line(), 0..6),
        secret in secret_line(),
    ) {
        let text = format!("{}\n[models.m]\nmodel = \"x\"\n{secret}\n", before.join("\n"));
        if let Some(message) = parse(&text) {
            prop_assert!(!message.contains(SECRET), "{message}");
        }
    }
}
