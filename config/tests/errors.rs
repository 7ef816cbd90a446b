//! Every way a configuration is refused, with the exact message: the key, where it is, what is allowed.

use turnstile_config::{Config, ConfigError, Location};

/// The message `text` is refused with.
fn err(text: &str) -> String {
    match Config::from_toml_str(text) {
        Ok(config) => panic!("accepted {text:?} as {config:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_provider() {
    assert_eq!(
        err("[models.local]\nprovider = \"foo\"\n"),
        r#"line 2, column 12: models.local.provider: unknown provider "foo" (allowed: openai, anthropic, scripted)"#
    );
}

#[test]
fn unknown_top_level_key() {
    assert_eq!(
        err("colour = \"blue\"\n"),
        "line 1, column 1: colour: unknown key (allowed: default_agent, limits, cluster, journal, tools, models, mcp, agents, tenants, protocols, webhooks, memory)"
    );
}

#[test]
fn unknown_agent_key() {
    assert_eq!(
        err("[agents.assistant]\nmodle = \"local\"\n"),
        "line 2, column 1: agents.assistant.modle: unknown key (allowed: description, model, system, tools, approval, approval_timeout_ms, on_timeout, history_turns, \
         hooks, tool_deadline_ms, retry_after_repair, max_steps_per_turn, context_budget_tokens, compaction_model, webhooks, tenants, version_policy, output, memory, overrides)"
    );
}

#[test]
fn unknown_keys_in_every_other_table() {
    assert_eq!(
        err("[limits]\nmax_bytes = 1\n"),
        "line 2, column 1: limits.max_bytes: unknown key (allowed: max_message_bytes, max_pending, when_idle_timeout_ms, max_goal_rounds, max_queued_commands, max_pending_bytes, tenant_requests_per_minute, tenant_request_burst, tenant_max_watches, watch_buffer_bytes, watch_buffer_total_bytes, max_spawn_depth, max_children)"
    );
    assert_eq!(
        err("[cluster]\nlease_ms = 1\n"),
        "line 2, column 1: cluster.lease_ms: unknown key (allowed: shards, partitions, replicas, lease_ttl_ms, renew_ms, \
         worker_ttl_ms, drain_timeout_ms, route_deadline_ms)"
    );
    assert_eq!(
        err("[models.local]\nmodel = \"m\"\napi_key = \"sk-secret\"\n"),
        "line 3, column 1: models.local.api_key: unknown key (allowed: provider, base_url, model, api_key_env, max_tokens, \
         timeout_ms, first_byte_timeout_ms, idle_timeout_ms, retries, fallback, prompt_cache)"
    );
    assert_eq!(
        err("[mcp.files]\ncommand = \"x\"\nargv = []\n"),
        "line 3, column 1: mcp.files.argv: unknown key (allowed: command, args, env, cwd, url, headers_env, tool_deadline_ms)"
    );
    assert_eq!(
        err("[agents.a]\nhooks = [{ url = \"http://127.0.0.1:7700\", timeout_ms = 5 }]\n"),
        "line 2, column 43: agents.a.hooks[0].timeout_ms: unknown key (allowed: url, deadline_ms, on_failure)"
    );
}

#[test]
fn missing_key_variable() {
    let config = Config::from_toml_str("[models.local]\nmodel = \"m\"\napi_key_env = \"LOCAL_KEY\"\n").unwrap();
    let local = &config.models["local"];
    assert_eq!(
        local.resolve_api_key(|_| None).unwrap_err().to_string(),
        r#"models.local.api_key_env: environment variable LOCAL_KEY is not set; set it to the API key of model "local", or remove this key"#
    );
    assert_eq!(
        local.resolve_api_key(|_| Some("  \n".to_owned())).unwrap_err().to_string(),
        r#"models.local.api_key_env: environment variable LOCAL_KEY is empty; set it to the API key of model "local", or remove this key"#
    );
    let err = local.resolve_api_key(|_| None).unwrap_err();
    assert_eq!(err.key(), Some("models.local.api_key_env"));
}

#[test]
fn missing_header_variable() {
    let config = Config::from_toml_str(
        "[mcp.files]\nurl = \"https://files.example/mcp\"\nheaders_env = { Authorization = \"FILES_TOKEN\" }\n",
    )
    .unwrap();
    let files = &config.mcp["files"];
    assert_eq!(
        files.resolve_headers(|_| None).unwrap_err().to_string(),
        r#"mcp.files.headers_env.Authorization: environment variable FILES_TOKEN is not set; set it to the value of header Authorization for MCP server "files", or remove this key"#
    );
    let headers = files.resolve_headers(|v| (v == "FILES_TOKEN").then(|| "Bearer t0k".to_owned())).unwrap();
    assert_eq!(headers.len(), 1);
    assert_eq!((headers[0].0.as_str(), headers[0].1.expose()), ("Authorization", "Bearer t0k"));
}

#[test]
fn a_key_written_where_its_variable_name_belongs_is_not_repeated() {
    let msg = err("[models.local]\nmodel = \"m\"\napi_key_env = \"sk-abc123\"\n");
    assert_eq!(
        msg,
        "line 3, column 15: models.local.api_key_env: must be an environment variable name: letters, digits and '_', \
         not starting with a digit, e.g. \"OPENAI_API_KEY\"; put the key in that variable and name the variable here"
    );
    assert!(!msg.contains("sk-abc123"));
    // A string where a number belongs is not repeated either.
    assert_eq!(
        err("[models.local]\nmodel = \"m\"\nretries = \"sk-abc123\"\n"),
        "line 3, column 11: models.local.retries: expected a non-negative integer no larger than 4294967295, found a string"
    );
}

#[test]
fn bad_url() {
    assert_eq!(
        err("[models.local]\nmodel = \"m\"\nbase_url = \"127.0.0.1:8080/v1\"\n"),
        "line 3, column 12: models.local.base_url: not an absolute http(s) URL: it must start with http:// or https://; \
         write it like \"http://127.0.0.1:8080/v1\""
    );
    assert_eq!(
        err("[agents.a]\nhooks = [{ url = \"http://\" }]\n"),
        "line 2, column 18: agents.a.hooks[0].url: not a valid URL: empty host; write it like \"http://127.0.0.1:8080/v1\""
    );
    let msg = err("[mcp.files]\nurl = \"https://me:hunter2@files.example/mcp\"\n");
    assert_eq!(
        msg,
        "line 2, column 7: mcp.files.url: a URL must not carry a user name or password; give credentials through an \
         environment variable (api_key_env, headers_env)"
    );
}

#[test]
fn agent_naming_a_missing_model() {
    assert_eq!(
        err("[agents.assistant]\nmodel = \"gpt\"\n[models.local]\nmodel = \"m\"\n"),
        r#"line 2, column 9: agents.assistant.model: no model named "gpt" (known: local, scripted)"#
    );
    assert_eq!(
        err("[agents.a]\ncompaction_model = \"big\"\n"),
        r#"line 2, column 20: agents.a.compaction_model: no model named "big" (known: scripted)"#
    );
}

#[test]
fn unknown_default_agent() {
    assert_eq!(
        err("default_agent = \"helper\"\n[agents.assistant]\n"),
        r#"line 1, column 17: default_agent: no agent named "helper" (known: assistant, scripted)"#
    );
}

#[test]
fn mcp_server_with_both_command_and_url_or_neither() {
    assert_eq!(
        err("[mcp.files]\ncommand = \"python3\"\nurl = \"http://127.0.0.1:9000/mcp\"\n"),
        "line 1, column 1: mcp.files: both command and url are set; a server is either stdio (command, args, env, cwd) \
         or streamable HTTP (url, headers_env)"
    );
    assert_eq!(
        err("[mcp.files]\nargs = [\"files_server.py\"]\n"),
        "line 1, column 1: mcp.files: neither command nor url is set; a server is either stdio (command, args, env, cwd) \
         or streamable HTTP (url, headers_env), e.g. command = \"python3\" or url = \"http://127.0.0.1:9000/mcp\""
    );
    assert_eq!(
        err("[mcp.h]\nurl = \"http://127.0.0.1:9000/mcp\"\nargs = []\n"),
        "line 1, column 1: mcp.h: args, env and cwd are for stdio servers (command); this one is streamable HTTP (url)"
    );
    assert_eq!(
        err("[mcp.s]\ncommand = \"x\"\nheaders_env = { Authorization = \"T\" }\n"),
        "line 1, column 1: mcp.s: headers_env is for streamable HTTP servers (url); this one is stdio (command)"
    );
}

#[test]
fn unknown_tool_reference() {
    assert_eq!(
        err("[agents.assistant]\ntools = [\"clock\", \"clok\"]\n"),
        r#"line 2, column 19: agents.assistant.tools[1]: unknown tool "clok" (allowed: clock, echo, sleep, spawn_agent, memory_get, memory_put, memory_search, mcp:SERVER/TOOL, mcp:SERVER/*, client:NAME)"#
    );
    assert_eq!(
        err("[mcp.files]\ncommand = \"x\"\n[agents.assistant]\ntools = [\"mcp:fils/*\"]\n"),
        r#"line 4, column 10: agents.assistant.tools[0]: "mcp:fils/*": no MCP server named "fils" (known: files)"#
    );
    assert_eq!(
        err("[agents.assistant]\ntools = [\"mcp:files/read\"]\n"),
        r#"line 2, column 10: agents.assistant.tools[0]: "mcp:files/read": no MCP server named "files" (known: none)"#
    );
    assert_eq!(
        err("[agents.a]\ntools = [\"goal_complete\"]\n"),
        r#"line 2, column 10: agents.a.tools[0]: "goal_complete" is offered automatically while the session has an active goal; remove it"#
    );
    assert_eq!(
        err("[agents.a]\ntools = [\"echo\", \"echo\"]\n"),
        r#"line 2, column 18: agents.a.tools[1]: "echo" is already listed (tools[0])"#
    );
}

/// Decision: an approval pattern that can match none of the agent's tools is an error. It is almost always
/// a typo, and a typo in an approval list silently leaves the tool it meant to guard unguarded.
#[test]
fn retry_after_repair_pattern_for_a_tool_the_agent_does_not_have() {
    // The message is the contract here: it names the key and how to fix it.
    assert_eq!(
        err("[agents.a]\ntools = [\"clock\"]\nretry_after_repair = [\"client:charge\"]\n"),
        r#"line 3, column 23: agents.a.retry_after_repair[0]: "client:charge" matches none of this agent's tools (tools: clock); add the tool to tools or remove the pattern"#
    );
    let config = turnstile_config::Config::from_toml_str(
        "[agents.a]\ntools = [\"clock\", \"client:charge\"]\nretry_after_repair = [\"client:charge\"]\n",
    )
    .unwrap();
    assert_eq!(config.agents["a"].retry_after_repair, vec!["client:charge".parse().unwrap()]);
}

#[test]
fn approval_pattern_for_a_tool_the_agent_does_not_have() {
    assert_eq!(
        err("[agents.a]\ntools = [\"clock\", \"client:lookup\"]\napproval = [\"client:deploy\"]\n"),
        r#"line 3, column 13: agents.a.approval[0]: "client:deploy" matches none of this agent's tools (tools: clock, client:lookup); add the tool to tools or remove the pattern"#
    );
    assert_eq!(
        err(
            "[mcp.files]\ncommand = \"x\"\n[agents.a]\ntools = [\"mcp:files/read_file\"]\napproval = [\"mcp:files/write_*\"]\n"
        ),
        r#"line 5, column 13: agents.a.approval[0]: "mcp:files/write_*" matches none of this agent's tools (tools: mcp:files/read_file); add the tool to tools or remove the pattern"#
    );
    assert_eq!(
        err("[agents.a]\napproval = [\"mcp:files/*\"]\n"),
        r#"line 2, column 13: agents.a.approval[0]: "mcp:files/*": no MCP server named "files" (known: none)"#
    );
    // A pattern under a whole server may match any tool the server lists.
    Config::from_toml_str(
        "[mcp.files]\ncommand = \"x\"\n[agents.a]\ntools = [\"mcp:files/*\"]\napproval = [\"mcp:files/write_*\"]\n",
    )
    .unwrap();
}

#[test]
fn zero_deadline() {
    assert_eq!(
        err("[agents.a]\ntool_deadline_ms = 0\n"),
        "line 2, column 20: agents.a.tool_deadline_ms: must be at least 1 (a deadline of 0 would fail every call)"
    );
    assert_eq!(
        err("[agents.a]\nhooks = [{ url = \"http://127.0.0.1:7700\", deadline_ms = 0 }]\n"),
        "line 2, column 57: agents.a.hooks[0].deadline_ms: must be at least 1 (a deadline of 0 would fail every step)"
    );
    assert_eq!(
        err("[mcp.files]\ncommand = \"x\"\ntool_deadline_ms = 0\n"),
        "line 3, column 20: mcp.files.tool_deadline_ms: must be at least 1 (a deadline of 0 would fail every call)"
    );
    assert_eq!(
        err("[tools]\ndeadline_ms = 0\n"),
        "line 2, column 15: tools.deadline_ms: must be at least 1 (a deadline of 0 would fail every call)"
    );
    assert_eq!(
        err("[models.m]\nmodel = \"x\"\ntimeout_ms = 0\n"),
        "line 3, column 14: models.m.timeout_ms: must be at least 1 (a timeout of 0 would fail every request)"
    );
}

#[test]
fn numbers_out_of_range() {
    assert_eq!(
        err("[limits]\nmax_pending = 0\n"),
        "line 2, column 15: limits.max_pending: must be at least 1 (0 would refuse every delivery)"
    );
    assert_eq!(
        err("[limits]\nmax_goal_rounds = 0\n"),
        "line 2, column 19: limits.max_goal_rounds: must be at least 1 (0 would refuse every goal)"
    );
    assert_eq!(
        err("[limits]\nmax_spawn_depth = 0\n"),
        "line 2, column 19: limits.max_spawn_depth: must be at least 1 (0 would refuse every spawn_agent call; leave \
         spawn_agent out of the agents' tools instead)"
    );
    assert_eq!(
        err("[limits]\nmax_message_bytes = 100\nmax_pending_bytes = 99\n"),
        "line 3, column 21: limits.max_pending_bytes: 99 is below max_message_bytes (100): a message of the largest \
         allowed size could never be pending; raise it to at least max_message_bytes"
    );
    assert_eq!(
        err("[limits]\nwatch_buffer_bytes = 1000\nwatch_buffer_total_bytes = 999\n"),
        "line 3, column 28: limits.watch_buffer_total_bytes: 999 is below watch_buffer_bytes (1000): one stream could \
         pass the gateway's total alone; raise it to at least watch_buffer_bytes"
    );
    assert_eq!(
        err("[limits]\nwatch_buffer_bytes = 0\n"),
        "line 2, column 22: limits.watch_buffer_bytes: must be at least 1 (0 would cut every Watch stream whose client \
         is one item behind)"
    );
    assert_eq!(
        err("[limits]\nmax_pending = -1\n"),
        "line 2, column 15: limits.max_pending: expected a non-negative integer, found -1"
    );
    assert_eq!(
        err("[cluster]\nshards = 99999999999\n"),
        "line 2, column 10: cluster.shards: expected a non-negative integer no larger than 4294967295, found 99999999999"
    );
    assert_eq!(
        err("[cluster]\nreplicas = 7\n"),
        "line 2, column 12: cluster.replicas: 7 is out of range (allowed: 1 to 5; 1 for one NATS server, 3 for a cluster)"
    );
    assert_eq!(
        err("[cluster]\npartitions = 8\nshards = 4\n"),
        "line 3, column 10: cluster.shards: 4 is below partitions (8); every partition needs at least one shard"
    );
    assert_eq!(
        err("[cluster]\nrenew_ms = 2000\n"),
        "line 2, column 12: cluster.renew_ms: 2000 must be below lease_ttl_ms (1500), or leases lapse between renewals; \
         try a third of it"
    );
    assert_eq!(
        err("[cluster]\nworker_ttl_ms = 400\n"),
        "line 2, column 17: cluster.worker_ttl_ms: 400 must be above renew_ms (400), or live workers drop out between \
         heartbeats; try several times it"
    );
    assert_eq!(
        err("[journal]\ndedup_horizon = 100\n"),
        "line 2, column 17: journal.dedup_horizon: 100 is below 10000, the least SPEC §2 promises for idempotent retries"
    );
    assert_eq!(
        err("[journal]\nsnapshot_every = 0\n"),
        "line 2, column 18: journal.snapshot_every: must be at least 1 (0 would mean a snapshot before any event)"
    );
    assert_eq!(
        err("[models.m]\nmodel = \"x\"\nfirst_byte_timeout_ms = 200000\n"),
        "line 3, column 25: models.m.first_byte_timeout_ms: 200000 is above timeout_ms (120000), so it could never fire; \
         lower it or raise timeout_ms"
    );
}

#[test]
fn models_and_names() {
    assert_eq!(
        err("[models.a]\nprovider = \"anthropic\"\n"),
        r#"line 1, column 9: models.a.model: missing; name the model at the provider, e.g. model = "claude-sonnet-4-5""#
    );
    assert_eq!(
        err("[models.a]\nprovider = \"scripted\"\nbase_url = \"http://x\"\n"),
        "line 3, column 12: models.a.base_url: the scripted provider has no endpoint; remove base_url"
    );
    assert_eq!(
        err("[agents.\"my agent\"]\n"),
        r#"line 1, column 9: agents."my agent": not a valid name (allowed: 1 to 64 letters, digits, '_' or '-')"#
    );
    assert_eq!(
        err("[mcp.fi__les]\ncommand = \"x\"\n"),
        r#"line 1, column 6: mcp.fi__les: not a valid name (allowed: 1 to 64 letters, digits, '_' or '-', without "__" or a trailing '_', since tools are offered as NAME__TOOL)"#
    );
    assert_eq!(
        err("[[agents.a.hooks]]\nurl = \"http://x\"\non_failure = \"retry\"\n"),
        r#"line 3, column 14: agents.a.hooks[0].on_failure: unknown on_failure "retry" (allowed: error, reject, skip)"#
    );
    assert_eq!(
        err("[agents.a]\nhooks = [{ deadline_ms = 5 }]\n"),
        "line 2, column 10: agents.a.hooks[0].url: missing; this key is required"
    );
}

#[test]
fn wrong_shapes() {
    assert_eq!(err("[agents]\na = 3\n"), "line 2, column 5: agents.a: expected a table, found 3");
    assert_eq!(err("agents = []\n"), "line 1, column 10: agents: expected a table, found an array");
    assert_eq!(
        err("[agents.a]\ntools = \"clock\"\n"),
        "line 2, column 9: agents.a.tools: expected an array, found a string"
    );
    assert_eq!(err("[agents.a]\ntools = [3]\n"), "line 2, column 10: agents.a.tools[0]: expected a string, found 3");
}

#[test]
fn toml_syntax_errors_have_line_and_column() {
    assert_eq!(err("[agents.a\nmodel = 1\n"), "line 1, column 10: invalid TOML: unclosed table, expected `]`");
    assert_eq!(err("x = \n"), "line 1, column 5: invalid TOML: string values must be quoted, expected literal string");
    assert_eq!(err("a = 1\na = 2\n"), "line 2, column 1: invalid TOML: duplicate key");
    assert!(matches!(Config::from_toml_str("a = 1\na = 2\n"), Err(ConfigError::Syntax { .. })));
}

#[test]
fn a_file_names_itself_in_errors() {
    let dir = std::env::temp_dir().join(format!("turnstile-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("turnstile.toml");
    std::fs::write(&file, "[agents.a]\nmodel = \"gpt\"\n").unwrap();
    let err = Config::load(&file).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(r#"{}:2:9: agents.a.model: no model named "gpt" (known: scripted)"#, file.display())
    );
    assert_eq!(err.location(), Some(&Location { file: Some(file.clone()), position: Some((2, 9)) }));
    std::fs::write(&file, "[agents\n").unwrap();
    assert!(
        Config::load(&file).unwrap_err().to_string().starts_with(&format!("{}:1:8: invalid TOML: ", file.display()))
    );

    let missing = dir.join("missing.toml");
    let err = Config::load_or_default(Some(&missing)).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!("{}: cannot read the configuration file: ", missing.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn validate_without_text_names_the_key_only() {
    let config = Config { default_agent: "nobody".to_owned(), ..Config::default() };
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        r#"default_agent: no agent named "nobody" (known: scripted)"#
    );
}
