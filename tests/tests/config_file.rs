//! The configuration file on the servers (`--config FILE`, env `TURNSTILE_CONFIG`; docs/CONFIGURATION.md).
//!
//! Bad input stops the process before anything listens: a non-zero exit, nothing on stdout's `listening`
//! lines, and one precise error on stderr naming the file, line, column and key. A good file changes what
//! the server does (`[limits] max_message_bytes`, its agents on `dev` and on a cluster), and a command-line
//! flag wins over the file's key.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tonic::Code;
use turnstile_proto::v1::{InjectMode, Target};
use turnstile_tests::binary::turnstile_bin;
use turnstile_tests::config::config_file;
use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT, DevOptions, DevServer, NatsServer, Session, user_msg};

/// A variable no test environment sets, named by `api_key_env`.
const UNSET_KEY_VAR: &str = "TURNSTILE_TEST_CONFIG_FILE_UNSET_KEY";

/// How a server run that was expected to stop ended.
#[derive(Debug)]
struct Refused {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Refused {
    /// The one `error: ` line on stderr.
    fn error_line(&self) -> &str {
        let mut errors = self.stderr.lines().filter(|l| l.starts_with("error: "));
        let line = errors.next().unwrap_or_else(|| panic!("no error line on stderr:\n{}", self.stderr));
        assert!(errors.next().is_none(), "one error line:\n{}", self.stderr);
        line
    }

    /// Exit code 1, nothing served, and `error: {expected}` on stderr.
    #[track_caller]
    fn assert_error(&self, expected: &str) {
        assert_eq!(self.code, Some(1), "{self:?}");
        assert!(!self.stdout.contains("listening"), "nothing was started:\n{}", self.stdout);
        assert_eq!(self.error_line(), format!("error: {expected}"), "{self:?}");
    }
}

/// Runs `turnstile ARGS` (with `env` set and [`UNSET_KEY_VAR`] unset) until it exits, bounded by
/// [`DEFAULT_WAIT`]; a process still running then (it started when it should have refused) fails the test.
async fn run_to_exit(args: &[&str], env: &[(&str, &Path)]) -> Refused {
    let bin = tokio::task::spawn_blocking(turnstile_bin).await.unwrap().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let (out, err) = (scratch.path().join("stdout"), scratch.path().join("stderr"));
    let mut command = Command::new(bin);
    command
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove(UNSET_KEY_VAR)
        .env_remove("TURNSTILE_CONFIG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("turnstile {args:?} still runs; it should have refused to start:\n{}", read(&out));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Refused { code: status.code(), stdout: read(&out), stderr: read(&err) }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `turnstile dev --config FILE` on free ports.
async fn dev_with_config(path: &Path) -> Refused {
    let path = path.to_str().unwrap();
    run_to_exit(&["dev", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config", path], &[]).await
}

#[tokio::test]
async fn an_unknown_provider_is_named_with_the_allowed_ones() {
    let (_dir, path) = config_file("[models.local]\nprovider = \"foo\"\nmodel = \"m\"\n");
    dev_with_config(&path).await.assert_error(&format!(
        "{}:2:12: models.local.provider: unknown provider \"foo\" (allowed: openai, anthropic, scripted)",
        path.display()
    ));
}

#[tokio::test]
async fn an_api_key_variable_that_is_not_set_is_named() {
    let (_dir, path) = config_file(&format!(
        "default_agent = \"assistant\"\n\n[models.local]\nprovider = \"openai\"\nbase_url = \
         \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\napi_key_env = \"{UNSET_KEY_VAR}\"\n\n[agents.assistant]\nmodel = \
         \"local\"\n"
    ));
    dev_with_config(&path).await.assert_error(&format!(
        "{}: agent \"assistant\" runs on model \"local\": models.local.api_key_env: environment variable {UNSET_KEY_VAR} \
         is not set; set it to the API key of model \"local\", or remove this key",
        path.display()
    ));
}

#[tokio::test]
async fn a_model_no_agent_runs_on_needs_no_key() {
    // Issue 31: a file with several hosted models and one agent; only that agent's model needs its key.
    let (_dir, path) = config_file(&format!(
        "[models.hosted]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\napi_key_env = \"{UNSET_KEY_VAR}\"\n\n\
         [agents.helper]\nsystem = \"Be brief.\"\n"
    ));
    let args = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    assert_eq!(s.followup(user_msg("m1", "hi")).await.unwrap().turn, Some(1));
    s.when_idle().await.unwrap();
}

#[tokio::test]
async fn a_url_that_is_not_absolute_is_refused() {
    let (_dir, path) = config_file("[models.local]\nmodel = \"m\"\nbase_url = \"127.0.0.1:8080/v1\"\n");
    dev_with_config(&path).await.assert_error(&format!(
        "{}:3:12: models.local.base_url: not an absolute http(s) URL: it must start with http:// or https://; write \
         it like \"http://127.0.0.1:8080/v1\"",
        path.display()
    ));
}

#[tokio::test]
async fn an_agent_naming_a_missing_model_is_refused() {
    let (_dir, path) = config_file("[agents.assistant]\nmodel = \"gpt\"\n");
    dev_with_config(&path).await.assert_error(&format!(
        "{}:2:9: agents.assistant.model: no model named \"gpt\" (known: scripted)",
        path.display()
    ));
}

#[tokio::test]
async fn an_unknown_key_is_refused_on_every_server() {
    let (_dir, path) = config_file("[agents.assistant]\nmodle = \"scripted\"\n");
    let expected =
        format!("{}:2:1: agents.assistant.modle: unknown key (allowed: description, model, ", path.display());
    let refused = dev_with_config(&path).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.error_line().starts_with(&format!("error: {expected}")), "{refused:?}");

    // The cluster roles read the file before they dial NATS: nothing listens at this URL.
    let file = path.to_str().unwrap();
    for role in ["gateway", "worker"] {
        let args = [role, "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"];
        let refused = run_to_exit(&[&args[..], &["--config", file]].concat(), &[]).await;
        assert_eq!(refused.code, Some(1), "{role}: {refused:?}");
        assert!(!refused.stdout.contains("listening"), "{role}: {refused:?}");
        assert!(refused.error_line().starts_with(&format!("error: {expected}")), "{role}: {refused:?}");
    }
}

#[tokio::test]
async fn a_missing_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let refused = dev_with_config(&path).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    let prefix = format!("error: {}: cannot read the configuration file: ", path.display());
    assert!(refused.error_line().starts_with(&prefix), "{refused:?}");
}

#[tokio::test]
async fn the_environment_variable_names_the_file_like_the_flag() {
    let (_dir, path) = config_file("[models.local]\nprovider = \"foo\"\nmodel = \"m\"\n");
    let by_flag = dev_with_config(&path).await;
    let by_env =
        run_to_exit(&["dev", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"], &[("TURNSTILE_CONFIG", &path)]).await;
    by_env.assert_error(by_flag.error_line().trim_start_matches("error: "));

    // And a good file by the variable is applied.
    let (_dir, path) = config_file("[limits]\nmax_message_bytes = 200\n");
    let env = vec![("TURNSTILE_CONFIG".to_owned(), path.to_str().unwrap().to_owned())];
    let server = DevServer::start_with(DevOptions { env, ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let err = s.followup(user_msg("big", &"x".repeat(134))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

#[tokio::test]
async fn max_message_bytes_from_the_file_refuses_a_longer_followup() {
    // A message counts its id, its text and 64 bytes for its block: "big" with 134 bytes of text is 201.
    let (_dir, path) = config_file("[limits]\nmax_message_bytes = 200\n");
    let args = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let err = s.followup(user_msg("big", &"x".repeat(134))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(
        err.message(),
        "message big counts 201 bytes (its id, source and every field of every block, plus 64 per block), over \
         the limit of 200 (config limits.max_message_bytes); split it or send the data by reference"
    );
    assert!(s.info().await.is_err(), "nothing was written");
    // Exactly at the limit is accepted.
    assert_eq!(s.followup(user_msg("max", &"x".repeat(133))).await.unwrap().seq, 1);

    // The CLI prints the usual error line and exits 1.
    let session = s.reference();
    let text = "y".repeat(200);
    let url = server.url();
    let refused =
        run_to_exit(&["--addr", &url, "--tenant", &session.tenant, "followup", &session.id, &text], &[]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.error_line().starts_with("error: INVALID_ARGUMENT: message "), "{refused:?}");
    assert!(
        refused.error_line().ends_with(
            "over the limit of 200 (config limits.max_message_bytes); split it or send the data by reference"
        ),
        "{refused:?}"
    );
}

#[tokio::test]
async fn max_pending_bytes_from_the_file_refuses_a_delivery_over_it_and_writes_nothing() {
    // Each message counts its id, its text and 64 bytes for its block: 196 + 136 pending leaves 68.
    let (_dir, path) = config_file("[limits]\nmax_message_bytes = 200\nmax_pending_bytes = 400\n");
    let args = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    s.queue(user_msg("q1", &"a".repeat(130))).await.unwrap();
    s.inject(user_msg("i1", &"b".repeat(70))).await.unwrap();
    let before = s.inbox().await.unwrap();

    let err = s.queue(user_msg("q2", &"c".repeat(7))).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains(
            "332 bytes pending; 73 more would make 405, above the limit of 400 (config limits.max_pending_bytes"
        ),
        "{err:?}"
    );
    let err = s.splice(Target::NextStep, 0, 0, vec![user_msg("z1", "zz"), user_msg("z2", "zzzzz")]).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(s.inbox().await.unwrap(), before, "the refused deliveries wrote nothing");

    // Exactly at the limit is accepted, and the refused id is a new message once room is made.
    s.queue(user_msg("q3", "cc")).await.unwrap();
    s.remove("q3").await.unwrap();
    s.queue(user_msg("q2", "cc")).await.unwrap();
    let inbox = s.inbox().await.unwrap();
    let ids: Vec<&str> = inbox.next_turn.iter().chain(&inbox.next_step).map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["q1", "q2", "i1"]);
}

#[tokio::test]
async fn a_request_over_the_derived_size_limit_is_refused_before_it_is_decoded() {
    // max(max_pending_bytes, max_message_bytes) + 1 MiB of envelope (decision 0033).
    let (_dir, path) = config_file("[limits]\nmax_message_bytes = 200\nmax_pending_bytes = 400\n");
    let args = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let limit = 400 + 1024 * 1024;
    let err = s.followup(user_msg("big", &"x".repeat(limit))).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains(&format!("the limit is: {limit} bytes")), "{err:?}");
    assert!(s.info().await.is_err(), "nothing was written");
    // Under the limit the request is decoded and the driver's own message limit answers.
    let err = s.followup(user_msg("big", &"x".repeat(limit - 1024))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

#[tokio::test]
async fn a_flag_wins_over_the_file() {
    let (_dir, path) = config_file("[cluster]\npartitions = 2\n");
    let config = path.to_str().unwrap().to_owned();

    // The file alone: two partitions.
    let nats = NatsServer::start().await.unwrap();
    let args = vec!["--nats".to_owned(), nats.url(), "--config".to_owned(), config.clone()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains(&format!("journal    JetStream at {} (2 partitions, 1 replica)", nats.url())), "{log}");
    assert_eq!(streams(&nats).await, ["TURNSTILE_EVENTS_0", "TURNSTILE_EVENTS_1"]);
    server.stop().await;

    // --partitions 3 over the file's 2: three streams.
    let nats = NatsServer::start().await.unwrap();
    let args = vec!["--nats".to_owned(), nats.url(), "--config".to_owned(), config, "--partitions".into(), "3".into()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains(&format!("journal    JetStream at {} (3 partitions, 1 replica)", nats.url())), "{log}");
    assert_eq!(streams(&nats).await, ["TURNSTILE_EVENTS_0", "TURNSTILE_EVENTS_1", "TURNSTILE_EVENTS_2"]);
    server.stop().await;
}

/// The names of the event streams on `nats`, sorted.
async fn streams(nats: &NatsServer) -> Vec<String> {
    use futures::TryStreamExt as _;
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut names: Vec<String> = js.stream_names().try_collect().await.unwrap();
    names.retain(|n| n.starts_with("TURNSTILE_EVENTS_"));
    names.sort();
    names
}

/// A file that adds an agent and makes it the default.
const HELPER: &str = "default_agent = \"helper\"\n\n[agents.helper]\nsystem = \"Be brief.\"\ntools = [\"echo\"]\n";

/// The file's agents are the ones a session may be configured with, and its default agent is what an
/// unconfigured session reports and runs.
async fn the_files_agents_are_served(s: &Session) {
    let err = s.configure("nope", InjectMode::Pending).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("helper, scripted"), "the file's agents are listed: {}", err.message());
    s.followup(user_msg("A", "hello")).await.unwrap();
    let info = s.when_idle().await.unwrap();
    assert_eq!(info.agent, "helper", "an unconfigured session runs the file's default agent");
    assert_eq!(s.configure("scripted", InjectMode::Pending).await.unwrap().agent, "scripted");
}

#[tokio::test]
async fn the_files_agents_run_on_dev() {
    let (_dir, path) = config_file(HELPER);
    let args = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    the_files_agents_are_served(&server.session()).await;
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(
        log.contains(&format!("config     {} (agents: helper, scripted; default helper)", path.display())),
        "{log}"
    );
}

/// In the `cluster` test group (docs/TESTING.md): it runs a worker and a gateway.
mod cluster {
    use super::*;

    #[tokio::test]
    async fn the_files_agents_run_on_a_cluster() {
        let (_dir, path) = config_file(HELPER);
        let config = vec!["--config".to_owned(), path.to_str().unwrap().to_owned()];
        let mut opts = ClusterOptions::new(1, 1);
        opts.worker_args.clone_from(&config);
        opts.gateway_args = config;
        let cluster = Cluster::start_with(opts).await.unwrap();
        the_files_agents_are_served(&cluster.session(0)).await;
    }
}
