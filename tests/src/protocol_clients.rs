//! What the tests of the agent protocols (SPEC §19, docs/PROTOCOLS.md) share: a `turnstile dev` whose
//! tokens name tenants and whose configuration the test gives, and a protocol's own unmodified client run
//! against it — a Python `unittest` module of `tests/protocols` with the interpreter of `.ci/venv`
//! (`TURNSTILE_TEST_PYTHON`), or a node script.

use std::process::{Command, Output};

use tempfile::TempDir;

use crate::HarnessError;
use crate::binary::workspace_root;
use crate::dev::{Backend, DevOptions, DevServer};

/// The agents the protocol tests share: `guarded` runs the built-in `echo` behind an approval (SPEC §9);
/// `only-b` serves tenant B alone (decision 0091).
pub const GUARDED_AND_ONLY_B: &str = r#"
[agents.guarded]
model = "scripted"
description = "Echoes, but asks before it runs echo."
tools = ["echo"]
approval = ["echo"]

[agents.only-b]
model = "scripted"
tenants = ["tenant-b"]
"#;

/// `turnstile dev` on `backend` with `config` (a TOML file in a new directory) and a token file of
/// `tokens`, each `(token, tenant)`. The directory lives as long as the returned handle.
pub async fn dev_with_tokens(
    backend: Backend,
    config: &str,
    tokens: &[(&str, &str)],
) -> Result<(DevServer, TempDir), HarnessError> {
    let dir = tempfile::tempdir().map_err(|e| HarnessError::io("making a directory for the server's files", e))?;
    let token_file = dir.path().join("tokens.txt");
    let lines: String = tokens.iter().map(|(token, tenant)| format!("{token} {tenant}\n")).collect();
    std::fs::write(&token_file, lines).map_err(|e| HarnessError::io("writing the token file", e))?;
    let config_file = dir.path().join("turnstile.toml");
    std::fs::write(&config_file, config).map_err(|e| HarnessError::io("writing the configuration", e))?;
    let options = DevOptions {
        extra_args: vec!["--auth-tokens".into(), token_file.display().to_string()],
        env: vec![("TURNSTILE_CONFIG".into(), config_file.display().to_string())],
        ..DevOptions::default()
    };
    Ok((backend.start_dev_with(options).await?, dir))
}

/// Runs `python -m unittest -v MODULES…` in `tests/protocols` with `env`, and returns what it printed.
/// Panics (the test fails) with that output and `server`'s log when a Python test failed or none ran.
/// `TURNSTILE_TEST_PYTHON` unset panics naming `scripts/setup-test-deps`.
pub async fn python_unittest(server: &DevServer, what: &str, modules: &[&str], env: Vec<(String, String)>) -> String {
    let python = std::env::var("TURNSTILE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
    });
    let mut args: Vec<String> = ["-W", "ignore::ResourceWarning", "-m", "unittest", "-v"].map(String::from).to_vec();
    args.extend(modules.iter().map(|m| (*m).to_owned()));
    let output = run(Command::new(python).args(args).current_dir(workspace_root().join("tests/protocols")), env).await;
    let text = checked(server, what, &output);
    assert!(!text.contains("Ran 0 tests"), "no Python test of {what} ran:\n{text}");
    println!("{text}");
    text
}

/// Runs `node SCRIPT` (a path from the top of the checkout) with `env`, and returns what it printed;
/// panics like [`python_unittest`] when it fails.
pub async fn node_script(server: &DevServer, what: &str, script: &str, env: Vec<(String, String)>) -> String {
    let output = run(Command::new("node").arg(workspace_root().join(script)), env).await;
    checked(server, what, &output)
}

async fn run(command: &mut Command, env: Vec<(String, String)>) -> Output {
    command.envs(env).env("PYTHONUNBUFFERED", "1");
    let mut command = std::mem::replace(command, Command::new("true"));
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap_or_else(|e| panic!("the client's task panicked: {e}"))
        .unwrap_or_else(|e| panic!("the client did not start ({e}); scripts/setup-test-deps installs it"))
}

fn checked(server: &DevServer, what: &str, output: &Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the {what} tests failed ({}):\n{text}\n--- server log:\n{}",
        output.status,
        server.log_tail()
    );
    text
}
