//! The TypeScript client (`clients/typescript`, npm package `@turnstile/client`) tested by its own suites
//! (`clients/typescript/test/*.test.mjs`, Node's `node --test`) against real processes started here with
//! the harness: `turnstile dev`, and a local cluster whose gateway the Node test asks this file to kill and
//! restart through a control port. Each test builds the package first (`build.mjs`: buf generate + tsc,
//! a no-op when nothing changed; runs are serialised with flock(1)), so the suites always test the
//! current protos and sources. Also: `npm pack` installs into an empty directory with no network, and the
//! README's example, run from there, prints what the README shows. docs/decisions/0055-typescript-client.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use turnstile_tests::binary::workspace_root;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Cluster, DevOptions, DevServer};

/// What a Node suite may take: its own waits are bounded at 30 s each.
const NODE_TIMEOUT: Duration = Duration::from_secs(150);

const INSTALL_HINT: &str = "run scripts/setup-test-deps (it runs `npm ci` in clients/typescript and fills npm's \
                            cache with the package's dependencies)";

/// The agents of the dev server the API suite runs against: the default `helper` with the built-in
/// `echo` and the client tools the suite serves, and `careful`, whose `echo` waits for approval; webhooks
/// may target loopback.
const AGENTS: &str = r#"default_agent = "helper"

[agents.helper]
tools = ["echo", "client:lookup", "client:fails", "client:where", "client:wait"]

[agents.careful]
tools = ["echo"]
approval = ["echo"]

# The webhook test's receiver listens on loopback.
[webhooks]
allow_private = true
"#;

/// A `turnstile dev` running [`AGENTS`] (and the directory of its configuration file, to keep).
async fn dev_with_agents() -> (tempfile::TempDir, DevServer) {
    let (dir, config) = config_file(AGENTS);
    let options = DevOptions { extra_args: config_args(&config), ..DevOptions::default() };
    (dir, DevServer::start_with(options).await.unwrap())
}

fn package_dir() -> PathBuf {
    workspace_root().join("clients/typescript")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Runs `program args` in `dir`, bounded, and returns its output (whatever its exit status).
async fn run(program: &str, args: &[&str], dir: &Path, env: &[(&str, String)]) -> Output {
    let mut command = tokio::process::Command::new(program);
    command.args(args).current_dir(dir).kill_on_drop(true).stdin(std::process::Stdio::null());
    command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    match tokio::time::timeout(NODE_TIMEOUT, command.output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("could not run {program}: {e}")),
        Err(_) => panic!("{program} {args:?} did not finish within {NODE_TIMEOUT:?}"),
    }
}

/// Builds the package (buf generate, tsc, the tests' type check) unless `.build-stamp` says it is current.
/// flock(1) keeps two test processes from building into the same `dist/` at once.
async fn build() {
    let dir = package_dir();
    assert!(dir.join("node_modules/.bin/tsc").is_file(), "{} has no node_modules; {INSTALL_HINT}", dir.display());
    let output = run("flock", &[".build.lock", "node", "build.mjs"], &dir, &[]).await;
    assert!(output.status.success(), "building clients/typescript failed:\n{}", text(&output));
}

/// `node --test FILES` with the TAP reporter (whose summary is checked) and a per-test bound.
fn node_test_args<'a>(files: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--test", "--test-reporter=tap", "--test-timeout=120000"];
    args.extend(files);
    args
}

/// Fails with the suite's output (and `context`) unless it exited 0 with at least one test passed and none
/// failed; prints the output otherwise.
fn assert_passed(output: &Output, files: &[&str], context: &str) {
    let out = text(output);
    assert!(output.status.success(), "node --test {files:?} failed ({}):\n{out}\n{context}", output.status);
    let count = |label: &str| {
        out.lines().find_map(|l| l.strip_prefix(label)).and_then(|n| n.trim().parse::<u32>().ok()).unwrap_or(0)
    };
    assert!(count("# pass ") > 0 && count("# fail ") == 0, "no Node test ran, or one failed:\n{out}");
    println!("{out}");
}

/// Runs `node --test FILES` in the package with `env` and fails with its output unless every test passed
/// and at least one ran.
async fn node_test(files: &[&str], env: &[(&str, String)]) {
    let output = run("node", &node_test_args(files), &package_dir(), env).await;
    assert_passed(&output, files, "");
}

/// The API suite (every RPC, errors, client tools called by an agent, the address function, the
/// browser entry over gRPC-Web on the HTTP port) and the unit tests, against one `turnstile dev`.
#[tokio::test]
async fn typescript_client_calls_every_rpc_against_dev() {
    build().await;
    let (_config, dev) = dev_with_agents().await;
    let env = [
        ("TURNSTILE_ADDR", dev.addr().to_string()),
        ("TURNSTILE_HTTP_ADDR", dev.http_addr().expect("the dev server's HTTP port").to_string()),
    ];
    node_test(&["test/unit.test.mjs", "test/parity.test.mjs", "test/client.test.mjs", "test/web.test.mjs"], &env).await;
}

/// A delivery whose connection drops after the server applied it is retried with the same MessageId and
/// answered with the first acceptance; a cancel in the same situation is not repeated; a tool server
/// registers again and serves the next call.
#[tokio::test]
async fn typescript_client_retries_a_delivery_after_a_dropped_connection() {
    build().await;
    let (_config, dev) = dev_with_agents().await;
    node_test(&["test/retry.test.mjs"], &[("TURNSTILE_ADDR", dev.addr().to_string())]).await;
}

/// `watch()` through a TCP proxy that drops the connection mid-reply reopens with the streaming step's
/// offsets as `resume` (SPEC §14): the deltas seen are the reply, each byte once; a watch started `from` a
/// saved position gets only the rest.
#[tokio::test]
async fn typescript_watch_resumes_a_streaming_reply_across_a_dropped_connection() {
    build().await;
    let dev = DevServer::start().await.unwrap();
    node_test(&["test/stream-resume.test.mjs"], &[("TURNSTILE_ADDR", dev.addr().to_string())]).await;
}

/// `watch()` across a gateway of a local cluster (1 worker, 2 gateways) killed with SIGKILL and started
/// again on a new port: the Node test drives the kill and the restart through a control port served here
/// (one command per connection: `gateway G`, `kill-gateway G`, `restart-gateway G`; answers `ok [ADDR]`).
#[tokio::test]
async fn typescript_watch_resumes_across_a_gateway_kill_on_a_cluster() {
    build().await;
    let mut cluster = Cluster::start(1, 2).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let env = [("CONTROL_ADDR", listener.local_addr().unwrap().to_string())];
    let files = ["test/watch-resume.test.mjs"];
    let (args, dir) = (node_test_args(&files), package_dir());
    let suite = run("node", &args, &dir, &env);
    tokio::pin!(suite);
    let output = loop {
        tokio::select! {
            output = &mut suite => break output,
            accepted = listener.accept() => {
                let (stream, _) = accepted.unwrap();
                let (read, mut write) = stream.into_split();
                let mut line = String::new();
                BufReader::new(read).read_line(&mut line).await.unwrap();
                let answer = control(&mut cluster, line.trim()).await;
                write.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
                write.shutdown().await.unwrap();
            }
        }
    };
    assert_passed(&output, &files, &cluster.logs());
}

/// The chat app of `examples/chat.mjs`, installed from `npm pack` like the README's examples, against
/// `turnstile dev` with [`AGENTS`] (issue 41): a first chat configures a new session with `careful`, gets
/// its replies streamed and approves the call its second line makes from the approvals inbox; a second chat
/// shows that history (read from the transcript) and denies a call; a third, with nothing to say, prints
/// the history alone, which is exactly what the second printed.
#[tokio::test]
async fn typescript_chat_example_renders_history_streams_replies_and_answers_approvals() {
    build().await;
    let scratch = tempfile::tempdir().unwrap();
    let app = scratch.path();
    // The package as an app's dependency: node_modules/@turnstile/client is this package, built.
    let scope = app.join("node_modules/@turnstile");
    std::fs::create_dir_all(&scope).unwrap();
    std::os::unix::fs::symlink(package_dir(), scope.join("client")).unwrap();
    std::fs::copy(package_dir().join("examples/chat.mjs"), app.join("chat.mjs")).unwrap();
    let (_config, dev) = dev_with_agents().await;
    let chat = |args: &'static [&'static str], input: &'static str| {
        let addr = dev.addr().to_string();
        let app = app.to_owned();
        async move {
            let mut command = tokio::process::Command::new("node");
            command.arg("chat.mjs").args(args).current_dir(&app).env("TURNSTILE_ADDR", addr).kill_on_drop(true);
            command.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
            command.stderr(std::process::Stdio::piped());
            let mut child = command.spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).await.unwrap();
            drop(stdin);
            let output = tokio::time::timeout(NODE_TIMEOUT, child.wait_with_output()).await.unwrap().unwrap();
            assert!(output.status.success(), "chat.mjs {args:?} failed:\n{}", text(&output));
            String::from_utf8(output.stdout).unwrap()
        }
    };
    let first = chat(&["chat-1", "--agent", "careful"], "hello\n[[tool:echo from the inbox]]\n").await;
    let second = chat(&["chat-1", "--deny"], "[[tool:echo no way]]\n").await;
    let history = chat(&["chat-1"], "").await;
    let first_lines: Vec<&str> = first.lines().collect();
    assert_eq!(first_lines.first(), Some(&"(a new session)"), "{first}");
    for line in
        ["you: hello", "assistant: echo: hello", "[turn 1 completed]", "approval: echo(from the inbox) approved"]
    {
        assert!(first_lines.contains(&line), "{line:?} in:\n{first}");
    }
    for line in ["approval: echo(no way) denied", "  -> denied: denied in chat", "[turn 3 completed]"] {
        assert!(second.lines().any(|l| l == line), "{line:?} in:\n{second}");
    }
    assert!(
        second.starts_with(&first_lines[1..].join("\n")),
        "the second chat begins with the first's history:\n{second}"
    );
    assert_eq!(history, second, "the history prints what the chats printed");
    println!("{history}");
}

/// One command of the control port, answered `ok [VALUE]` or `error MESSAGE`.
async fn control(cluster: &mut Cluster, command: &str) -> String {
    let (verb, g) = command.split_once(' ').unwrap_or((command, ""));
    let Ok(g) = g.parse::<usize>() else { return format!("error {command:?}: name a gateway index") };
    if g >= cluster.gateways() {
        return format!("error {command:?}: the cluster has {} gateways", cluster.gateways());
    }
    let addr = |cluster: &Cluster| cluster.gateway_url(g).trim_start_matches("http://").to_owned();
    match verb {
        "gateway" => format!("ok {}", addr(cluster)),
        "kill-gateway" => {
            cluster.kill9_gateway(g);
            "ok".to_owned()
        }
        "restart-gateway" => match cluster.restart_gateway(g).await {
            Ok(()) => format!("ok {}", addr(cluster)),
            Err(e) => format!("error {e}"),
        },
        _ => format!("error unknown command {command:?}: gateway G, kill-gateway G or restart-gateway G"),
    }
}

/// The README's sections whose example runs here, with what each prints.
const README_EXAMPLES: [&str; 2] = ["## Example", "## Run a turn, follow its events"];

/// The README's example under `heading` (the first ```js block of that section) and the output it shows
/// (the ```text block after it).
fn readme_example(heading: &str) -> (String, String) {
    let readme = std::fs::read_to_string(package_dir().join("README.md")).unwrap();
    let section = readme
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("README.md has no `{heading}` section"));
    let block = |fence: &str, from: &str| -> (String, usize) {
        let start =
            from.find(fence).unwrap_or_else(|| panic!("no {fence} block in the README's example")) + fence.len();
        let len = from[start..].find("\n```").expect("a closed code block");
        (from[start..start + len].trim_start_matches('\n').to_owned(), start + len)
    };
    let (code, end) = block("```js", section);
    let (shown, _) = block("```text", &section[end..]);
    (code, shown)
}

/// The session ids the example mints, replaced so that two runs compare equal.
fn normalise(output: &str) -> String {
    output
        .lines()
        .map(|line| match line.find("quickstart-") {
            Some(at) => {
                let rest = &line[at + "quickstart-".len()..];
                let id_len = rest.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(rest.len());
                format!("{}quickstart-ID{}", &line[..at], &rest[id_len..])
            }
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `npm pack` of the package installs into an empty directory without the network (`--offline`, from
/// npm's cache, which scripts/setup-test-deps fills), and the README's examples, run there against
/// `turnstile dev`, print exactly what the README shows (the minted session id aside).
#[tokio::test]
async fn typescript_package_installs_from_npm_pack_and_runs_the_readme_example() {
    build().await;
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path().to_string_lossy().into_owned();
    let packed =
        run("npm", &["pack", "--ignore-scripts", "--json", "--pack-destination", &dest], &package_dir(), &[]).await;
    assert!(packed.status.success(), "npm pack failed:\n{}", text(&packed));
    let listing: serde_json::Value = serde_json::from_slice(&packed.stdout).unwrap();
    let tarball = scratch.path().join(listing[0]["filename"].as_str().expect("npm pack names its tarball"));
    let files: Vec<&str> = listing[0]["files"].as_array().unwrap().iter().filter_map(|f| f["path"].as_str()).collect();
    for needed in [
        "README.md",
        "package.json",
        "dist/index.js",
        "dist/index.d.ts",
        "dist/browser.js",
        "dist/gen/turnstile/v1/agent_pb.js",
    ] {
        assert!(files.contains(&needed), "{needed} is not in the package: {files:?}");
    }
    assert!(
        !files.iter().any(|f| f.starts_with("src/") || f.starts_with("test/")),
        "sources in the package: {files:?}"
    );

    let app = scratch.path().join("app");
    std::fs::create_dir(&app).unwrap();
    let tarball = tarball.to_string_lossy().into_owned();
    let args = ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", tarball.as_str()];
    let installed = run("npm", &args, &app, &[]).await;
    assert!(
        installed.status.success(),
        "npm install --offline of the packed package failed ({INSTALL_HINT}):\n{}",
        text(&installed)
    );

    let dev = DevServer::start().await.unwrap();
    for heading in README_EXAMPLES {
        let (code, shown) = readme_example(heading);
        std::fs::write(app.join("quickstart.mjs"), &code).unwrap();
        let ran = run("node", &["quickstart.mjs"], &app, &[("TURNSTILE_ADDR", dev.addr().to_string())]).await;
        assert!(ran.status.success(), "the README's example under {heading} failed:\n{}", text(&ran));
        let printed = String::from_utf8_lossy(&ran.stdout);
        assert_eq!(
            normalise(printed.trim_end()),
            normalise(shown.trim_end()),
            "the example under {heading} printed:\n{printed}"
        );
        println!("{printed}");
    }
}
