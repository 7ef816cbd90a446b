//! Without a file, and for every key a file leaves out: today's hard-coded values (worker/src/config.rs,
//! the lease defaults and the CLI flags).

use std::time::Duration;

use turnstile_config::{AgentConfig, Builtin, Config, ModelConfig, Provider, SCRIPTED, ToolId, ToolRef};

#[test]
fn no_file_means_the_scripted_agent_on_the_scripted_model() {
    let config = Config::default();
    config.validate().unwrap();
    assert_eq!(config.default_agent, SCRIPTED);
    assert_eq!(config.agents.keys().collect::<Vec<_>>(), [SCRIPTED]);
    assert_eq!(config.models.keys().collect::<Vec<_>>(), [SCRIPTED]);
    assert!(config.mcp.is_empty());
    let agent = config.default_agent().unwrap();
    assert_eq!(
        agent.tools,
        [ToolRef::Builtin(Builtin::Sleep), ToolRef::Builtin(Builtin::Echo), ToolRef::Builtin(Builtin::Clock)]
    );
    assert_eq!(config.model_of(agent).unwrap().provider, Provider::Scripted);
    assert_eq!(config.model_of(agent).unwrap().endpoint(), None);
    assert!(agent.approval.is_empty() && agent.hooks.is_empty());
    assert!(agent.offers(ToolId::Builtin(Builtin::Sleep)) && !agent.offers(ToolId::Builtin(Builtin::SpawnAgent)));
}

#[test]
fn an_empty_file_and_no_file_are_the_same() {
    assert_eq!(Config::from_toml_str("").unwrap(), Config::default());
    assert_eq!(Config::from_toml_str("# nothing\n\n").unwrap(), Config::default());
    assert_eq!(Config::load_or_default(None).unwrap(), Config::default());
}

#[test]
fn the_defaults_are_todays_hard_coded_values() {
    let c = Config::default();
    assert_eq!((c.limits.max_message_bytes, c.limits.max_pending), (1024 * 1024, 1000));
    assert_eq!(c.limits.when_idle_timeout(), Duration::from_secs(30));
    assert_eq!(c.limits.max_goal_rounds, 100);
    assert_eq!((c.limits.max_spawn_depth, c.limits.max_children), (3, 16));
    assert_eq!((c.journal.snapshot_every, c.journal.dedup_horizon), (100, 10_000));
    assert_eq!(c.journal.passivate_after(), Duration::from_secs(300));
    assert_eq!((c.cluster.shards, c.cluster.partitions, c.cluster.replicas), (256, 1, 1));
    assert_eq!(c.cluster.lease_ttl(), Duration::from_millis(1500));
    assert_eq!(c.cluster.renew_every(), Duration::from_millis(400));
    assert_eq!(c.cluster.worker_ttl(), Duration::from_secs(3));
    assert_eq!(c.cluster.drain_timeout(), Duration::from_secs(10));
    assert_eq!(c.cluster.route_deadline(), Duration::from_secs(10));
    assert_eq!(c.tools.deadline_ms, 60_000);
}

#[test]
fn an_agent_or_model_table_with_no_keys_takes_every_default() {
    let config = Config::from_toml_str("[agents.bare]\n[models.m]\nmodel = \"x\"\n").unwrap();
    assert_eq!(
        config.agents["bare"],
        AgentConfig { name: "bare".into(), definition: "{}".into(), ..AgentConfig::default() }
    );
    assert_eq!(config.agents["bare"].model, SCRIPTED);
    assert!(config.agents["bare"].tools.is_empty());
    let m = &config.models["m"];
    assert_eq!(*m, ModelConfig { name: "m".into(), model: "x".into(), ..ModelConfig::default() });
    assert_eq!(m.endpoint().unwrap().as_str(), "https://api.openai.com/v1");
    assert_eq!(
        (m.max_tokens, m.timeout_ms, m.first_byte_timeout_ms, m.idle_timeout_ms, m.retries),
        (1024, 120_000, 30_000, 30_000, 3)
    );
}

#[test]
fn a_file_may_redefine_the_built_ins() {
    let config = Config::from_toml_str("[agents.scripted]\ntools = [\"echo\"]\nsystem = \"be brief\"\n").unwrap();
    assert_eq!(config.agents["scripted"].tools, [ToolRef::Builtin(Builtin::Echo)]);
    assert_eq!(config.agents["scripted"].system, "be brief");
    assert_eq!(config.models["scripted"], ModelConfig::scripted());
}

#[test]
fn flags_override_fields_and_validate_checks_the_result() {
    let mut config = Config::from_toml_str("[cluster]\nlease_ttl_ms = 3000\n").unwrap();
    config.cluster.renew_ms = 500;
    config.validate().unwrap();
    config.cluster.renew_ms = 3000;
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        "cluster.renew_ms: 3000 must be below lease_ttl_ms (3000), or leases lapse between renewals; try a third of it"
    );
}

#[test]
fn a_configuration_built_in_code_is_normalized_before_validation() {
    let mut config = Config::default();
    config.agents.insert(
        "coder".into(),
        AgentConfig { tools: vec![ToolRef::Builtin(Builtin::Clock)], ..AgentConfig::default() },
    );
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        r#"agents.coder: the entry's name is "" but its key is "coder"; call Config::normalize after building a configuration in code"#
    );
    config.normalize();
    config.validate().unwrap();
    assert_eq!(config.agents["coder"].name, "coder");
}

#[test]
fn tool_deadlines_come_from_the_server_then_the_agent_then_the_default() {
    let config = Config::from_toml_str(
        r#"
[tools]
deadline_ms = 5000
[mcp.slow]
url = "http://127.0.0.1:9000/mcp"
tool_deadline_ms = 600000
[mcp.fast]
command = "fast-server"
[agents.a]
tools = ["mcp:slow/*", "mcp:fast/*", "sleep"]
tool_deadline_ms = 20000
[agents.b]
tools = ["sleep"]
"#,
    )
    .unwrap();
    let (a, b) = (&config.agents["a"], &config.agents["b"]);
    let ms = |d: Duration| d.as_millis();
    assert_eq!(ms(config.tool_deadline(a, ToolId::Mcp { server: "slow", tool: "build" })), 600_000);
    assert_eq!(ms(config.tool_deadline(a, ToolId::Mcp { server: "fast", tool: "x" })), 20_000);
    assert_eq!(ms(config.tool_deadline(a, ToolId::Builtin(Builtin::Sleep))), 20_000);
    assert_eq!(ms(config.tool_deadline(b, ToolId::Builtin(Builtin::Sleep))), 5000);
}

#[test]
fn a_low_timeout_alone_lowers_the_stream_timeouts_it_would_conflict_with() {
    // A user who writes only `timeout_ms` must not be refused over keys they never wrote.
    let config = Config::from_toml_str("[models.m]\nmodel = \"x\"\ntimeout_ms = 20000\n").unwrap();
    let m = &config.models["m"];
    assert_eq!((m.timeout_ms, m.first_byte_timeout_ms, m.idle_timeout_ms), (20_000, 20_000, 20_000));
    // Above 30 s the defaults stay 30 s; a value the user wrote is kept as written.
    let config =
        Config::from_toml_str("[models.m]\nmodel = \"x\"\ntimeout_ms = 60000\nidle_timeout_ms = 5000\n").unwrap();
    let m = &config.models["m"];
    assert_eq!((m.first_byte_timeout_ms, m.idle_timeout_ms), (30_000, 5_000));
}
