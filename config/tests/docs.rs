//! `docs/CONFIGURATION.md` stays true: its examples parse, the defaults it lists are the code's, and every
//! key the parser knows has a row.

#![allow(clippy::unwrap_used)] // test helpers panic on a missing doc by design

use turnstile_config::Config;

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIGURATION.md")).unwrap()
}

/// The doc's ```toml blocks, in order.
fn toml_blocks(doc: &str) -> Vec<String> {
    doc.split("```toml\n").skip(1).map(|rest| rest.split("```").next().unwrap().to_owned()).collect()
}

#[test]
fn the_examples_parse_and_the_complete_one_lists_the_defaults() {
    let blocks = toml_blocks(&doc());
    assert_eq!(blocks.len(), 6, "models, mcp, agents, output, overrides, complete");
    let (snippets, complete) = blocks.split_at(5);
    let snippets = Config::from_toml_str(&snippets.concat()).unwrap();
    assert_eq!(snippets.agents["assistant"].model, "local");
    assert_eq!(snippets.agents["extractor"].output.as_ref().unwrap().name, "city");
    assert!(snippets.mcp.contains_key("search"));
    assert_eq!(snippets.agents["assistant"].overrides.models, ["local", "scripted"]);

    let complete = Config::from_toml_str(&complete[0]).unwrap();
    let defaults = Config::default();
    assert_eq!(complete.default_agent, defaults.default_agent);
    assert_eq!(complete.limits, defaults.limits);
    assert_eq!(complete.cluster, defaults.cluster);
    assert_eq!(complete.journal, defaults.journal);
    assert_eq!(complete.tools, defaults.tools);
    assert_eq!(complete.protocols, defaults.protocols);
    assert_eq!(complete.webhooks, defaults.webhooks);
    let gpt = &complete.models["gpt"];
    let model_defaults = turnstile_config::ModelConfig::default();
    assert_eq!(
        (gpt.max_tokens, gpt.timeout_ms, gpt.first_byte_timeout_ms, gpt.idle_timeout_ms, gpt.retries),
        (
            model_defaults.max_tokens,
            model_defaults.timeout_ms,
            model_defaults.first_byte_timeout_ms,
            model_defaults.idle_timeout_ms,
            model_defaults.retries
        )
    );
    assert_eq!(gpt.endpoint(), model_defaults.endpoint());
    let assistant = &complete.agents["assistant"];
    assert_eq!(assistant.history_turns, turnstile_config::AgentConfig::default().history_turns);
    assert_eq!(assistant.hooks[0].deadline_ms, 1000);
}

/// The keys the parser allows in a table, read from its "unknown key" message.
fn allowed_keys(table_with_unknown_key: &str) -> Vec<String> {
    let message = Config::from_toml_str(table_with_unknown_key).unwrap_err().to_string();
    let list = message.split("(allowed: ").nth(1).unwrap().trim_end_matches(')');
    list.split(", ").map(str::to_owned).collect()
}

#[test]
fn every_key_has_a_row() {
    let doc = doc();
    let tables = [
        "zz_unknown = 1",
        "[limits]\nzz_unknown = 1",
        "[cluster]\nzz_unknown = 1",
        "[journal]\nzz_unknown = 1",
        "[tools]\nzz_unknown = 1",
        "[models.m]\nzz_unknown = 1",
        "[mcp.s]\nzz_unknown = 1",
        "[agents.a]\nzz_unknown = 1",
        "[agents.a]\nhooks = [{ url = \"http://x\", zz_unknown = 1 }]",
        "[agents.a.output]\nschema = {}\nzz_unknown = 1",
        "[agents.a.overrides]\nzz_unknown = 1",
        "[tenants.t]\nzz_unknown = 1",
        "[protocols]\nzz_unknown = 1",
        "[webhooks]\nzz_unknown = 1",
        "[memory]\nzz_unknown = 1",
        "[agents.a]\nwebhooks = [{ url = \"http://x\", zz_unknown = 1 }]",
    ];
    for table in tables {
        for key in allowed_keys(table) {
            let row = format!("| `{key}` |");
            let heading = format!("## `[{key}]`");
            let named = ["models", "mcp", "agents", "tenants"].contains(&key.as_str());
            assert!(doc.contains(&row) || doc.contains(&heading) || named, "{table:?}: no row for {key}");
        }
    }
}
