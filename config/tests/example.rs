//! The example configuration file (`config/examples/turnstile.toml`) parses to what it says.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use turnstile_config::{
    AgentConfig, Builtin, Config, HookConfig, McpServerConfig, McpTransport, ModelConfig, OnFailure, Provider, ToolId,
    ToolPattern, ToolRef,
};

fn example_path() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/turnstile.toml"))
}

#[test]
fn the_api_example_parses_to_what_it_says() {
    let config = Config::load(example_path()).unwrap();
    assert_eq!(config.default_agent, "assistant");
    assert_eq!((config.limits.max_message_bytes, config.limits.max_pending), (1_048_576, 1000));

    assert_eq!(config.models.keys().collect::<Vec<_>>(), ["local", "scripted"]);
    assert_eq!(
        config.models["local"],
        ModelConfig {
            name: "local".into(),
            provider: Provider::OpenAi,
            base_url: Some("http://127.0.0.1:8080/v1".parse().unwrap()),
            model: "SmolLM2-135M-Instruct".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            max_tokens: 512,
            timeout_ms: 120_000,
            first_byte_timeout_ms: 30_000,
            idle_timeout_ms: 30_000,
            retries: 3,
            fallback: vec![],
            prompt_cache: false,
        }
    );
    assert_eq!(config.models["scripted"], ModelConfig::scripted());

    assert_eq!(
        config.mcp["files"],
        McpServerConfig {
            name: "files".into(),
            transport: McpTransport::Stdio {
                command: "python3".into(),
                args: vec!["files_server.py".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
            tool_deadline_ms: None,
        }
    );

    let assistant = &config.agents["assistant"];
    assert_eq!(
        *assistant,
        AgentConfig {
            name: "assistant".into(),
            description: String::new(),
            model: "local".into(),
            system: "You are a helpful assistant.".into(),
            tools: vec![
                ToolRef::Builtin(Builtin::Clock),
                ToolRef::Mcp { server: "files".into(), tool: None },
                ToolRef::Client("lookup".into()),
            ],
            approval: vec!["mcp:files/write_file".parse::<ToolPattern>().unwrap()],
            history_turns: 50,
            hooks: vec![HookConfig {
                url: "http://127.0.0.1:7700".parse().unwrap(),
                deadline_ms: 500,
                on_failure: OnFailure::Error,
            }],
            tool_deadline_ms: Some(60_000),
            retry_after_repair: vec![],
            approval_timeout_ms: None,
            on_timeout: turnstile_config::OnTimeout::Deny,
            max_steps_per_turn: None,
            context_budget_tokens: None,
            compaction_model: None,
            webhooks: vec![],
            tenants: None,
            version_policy: turnstile_config::VersionPolicy::Latest,
            output: None,
            memory: None,
            overrides: Default::default(),
            definition: assistant.definition.clone(),
        }
    );
    assert!(assistant.definition.starts_with(r#"{"approval":["mcp:files/write_file"],"history_turns":50,"#));
    assert_eq!(config.agents["scripted"], AgentConfig::scripted());
    assert_eq!(config.default_agent(), Some(assistant));
    assert_eq!(config.model_of(assistant), Some(&config.models["local"]));
    assert_eq!(config.agent_names(), "assistant, scripted");

    let write = ToolId::Mcp { server: "files", tool: "write_file" };
    let read = ToolId::Mcp { server: "files", tool: "read_file" };
    assert!(assistant.offers(write) && assistant.offers(read) && assistant.offers(ToolId::Client("lookup")));
    assert!(!assistant.offers(ToolId::Builtin(Builtin::Sleep)));
    assert!(assistant.requires_approval(write) && !assistant.requires_approval(read));
    assert_eq!(config.tool_deadline(assistant, read), Duration::from_secs(60));
}

#[test]
fn what_the_example_leaves_out_keeps_its_default() {
    let config = Config::load(example_path()).unwrap();
    let defaults = Config::default();
    assert_eq!(config.cluster, defaults.cluster);
    assert_eq!(config.journal, defaults.journal);
    assert_eq!(config.tools, defaults.tools);
    assert_eq!(config.limits.when_idle_timeout_ms, 30_000);
}

#[test]
fn the_example_resolves_its_key_from_the_environment_only() {
    let config = Config::load(example_path()).unwrap();
    let local = &config.models["local"];
    let key = local.resolve_api_key(|v| (v == "OPENAI_API_KEY").then(|| " sk-test \n".to_owned())).unwrap();
    assert_eq!(key.as_ref().map(|k| k.expose()), Some("sk-test"));
    assert_eq!(format!("{key:?}"), "Some(Secret(<redacted>))");
    assert_eq!(config.models["scripted"].resolve_api_key(|_| panic!("no variable to read")).unwrap(), None);
}
