//! The corpus (SPEC §18, decision 0073): logs and snapshots recorded by released builds, which every later
//! build must read and fold to the state recorded with them.
//!
//! `tests/corpus/<name>/` holds one recording (tests/corpus/README.md): the raw JetStream messages of every
//! session as `turnstile dev --nats` wrote them (`group/`), the same events in the single-event layout of
//! the logs before decision 0021 (`single/`) and in the embedded journal's files (`embedded/`), the
//! snapshots its KV bucket held part-way and at the end (`snapshots/`), the history archive's chunks of each
//! log (`archive/`, decision 0181; since `2026-12-07d-archive`), the events each log decodes to
//! (`events/`) and the state it folds to (`states/`). One synthetic session (`corpus/future`) carries an ignorable event of a type no build knows,
//! with a field none knows, as a newer writer would write it.
//!
//! - [`every_recording_folds_to_the_state_recorded_with_it`] reads every recording: each layout decodes to
//!   the recorded events, which fold to the recorded state (fields this build added take their defaults and
//!   are not compared; a field that disappeared is a failure), and every snapshot loads to that state too.
//!   An event decoding change that breaks an old log fails here.
//! - [`todays_binary_records_every_durable_type`] runs the recording scenario on a real `turnstile dev
//!   --nats` and checks the recording the same way, and that it holds every durable type this build knows.
//!   With `TURNSTILE_BLESS=1` it writes the recording into `tests/corpus/<date>/` (or
//!   `$TURNSTILE_CORPUS_NAME`; never over an existing one) with what that binary wrote: run it with the
//!   release's `TURNSTILE_BIN` once per release, and whenever a durable type, a field or a format is added.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::HeaderMap;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnstile_journal::jetstream::archive::{ARCHIVE_FORMAT, Chunk, ChunkBuilder, decode_chunk};
use turnstile_journal::jetstream::group::{decode_message, encode_group, group_headers};
use turnstile_journal::jetstream::{HEADER_EPOCH, HEADER_SEQ, HEADER_TYPE};
use turnstile_journal::snapshot::{
    MemorySnapshots, SNAPSHOT_VERSION, Snapshot, load_for_reads, load_state, reads_view,
};
use turnstile_journal::{EmbeddedLog, SessionLog};
use turnstile_model::event::DURABLE_TYPES;
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{Envelope, EventPayload, SessionRef, SessionState};
use turnstile_proto::codec::{self, EVENT_FORMAT};
use turnstile_proto::v1 as pb;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{DEFAULT_WAIT, DevOptions, DevServer, NatsServer, Session, data_msg, plugin_msg, user_msg};

/// Where the recordings live.
fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// What a recording says about itself.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    /// `git describe` of the build that recorded it.
    recorded_by: String,
    /// `SessionEvent.format`, `Turnstile-Format` and the snapshot schema version of that build.
    event_format: u32,
    group_format: u32,
    snapshot_version: u32,
    /// `Turnstile-Archive-Format` of the `archive/` layout (decision 0181); absent from recordings made
    /// before the archive existed, which have no `archive/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    archive_format: Option<u32>,
    /// Every session of the recording, `tenant/id`.
    sessions: Vec<String>,
}

/// One session's log as stored messages: `group/` (the JetStream layout of decision 0021) or `single/`
/// (one event per message, the layout before it).
#[derive(Debug, Serialize, Deserialize)]
struct StoredLog {
    session: String,
    messages: Vec<StoredMessage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredMessage {
    stream_seq: u64,
    headers: BTreeMap<String, String>,
    /// The message body, base64.
    body: String,
}

impl StoredMessage {
    fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in &self.headers {
            map.insert(k.as_str(), v.as_str());
        }
        map
    }

    fn body(&self) -> Vec<u8> {
        BASE64.decode(&self.body).unwrap()
    }
}

fn session_of(name: &str) -> SessionRef {
    let (tenant, id) = name.split_once('/').unwrap();
    SessionRef::new(tenant, id).unwrap()
}

/// `tenant.id`: a file name for a session (both halves are `[A-Za-z0-9_-]`).
fn file_stem(session: &SessionRef) -> String {
    format!("{}.{}", session.tenant, session.id)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not what the corpus stores: {e}", path.display()))
}

fn write_json(path: &Path, value: &impl Serialize) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut text = serde_json::to_string_pretty(value).unwrap();
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

/// The events of a stored log, decoded as the JetStream journal decodes a message.
fn decode_log(log: &StoredLog) -> Vec<Envelope> {
    let session = session_of(&log.session);
    let mut events = Vec::new();
    for m in &log.messages {
        let decoded = decode_message(&session, Some(&m.header_map()), &m.body(), m.stream_seq)
            .unwrap_or_else(|e| panic!("{}: stream message {}: {e}", log.session, m.stream_seq));
        events.extend(decoded);
    }
    events
}

/// The session's history archive as chunks of `per_chunk` log messages (decision 0181; the owner seals
/// ~1,000 events per chunk, more than a recorded session has, and the layout is the same at any size),
/// each stored as its message would be: stream sequences in the archive stream from 1.
fn archive_layout(log: &StoredLog, per_chunk: usize) -> Vec<StoredMessage> {
    let session = session_of(&log.session);
    let mut out = Vec::new();
    let mut after = 0;
    for messages in log.messages.chunks(per_chunk) {
        let mut builder = ChunkBuilder::after(after);
        for m in messages {
            builder.push(&session, Some(&m.header_map()), &m.body(), m.stream_seq).unwrap();
        }
        let (chunk, body) = builder.finish().unwrap();
        after = chunk.last;
        let headers = chunk.headers().iter().map(|(k, v)| (k.to_string(), v[0].as_str().to_owned())).collect();
        out.push(StoredMessage { stream_seq: out.len() as u64 + 1, headers, body: BASE64.encode(body) });
    }
    out
}

/// Checks a recording's `archive/` of one session against its log (`group/`): a chunk of this build's
/// archive format holds exactly the events of the log messages its `Turnstile-Log-First..=Log-Last`
/// name, the chunks follow each other from seq 1 and cover the log; a chunk of another format is one a
/// reader leaves for the log.
fn check_archive(what: &str, group: &StoredLog, archive: &StoredLog, manifest: &Manifest) {
    let session = session_of(&group.session);
    let readable = manifest.archive_format == Some(ARCHIVE_FORMAT);
    let mut last = 0;
    for m in &archive.messages {
        let headers = m.header_map();
        let Some(chunk) = Chunk::of(Some(&headers)) else {
            assert!(!readable, "{what}: archive message {} is not a chunk this build reads", m.stream_seq);
            continue;
        };
        assert!(readable, "{what}: archive message {} reads as a chunk of another format", m.stream_seq);
        assert_eq!(chunk.first, last + 1, "{what}: archive message {} does not follow", m.stream_seq);
        let events = decode_chunk(&session, Some(&headers), &m.body())
            .unwrap_or_else(|e| panic!("{what}: archive message {}: {e}", m.stream_seq));
        let held: Vec<StoredMessage> = group
            .messages
            .iter()
            .filter(|l| (chunk.log_first..=chunk.log_last).contains(&l.stream_seq))
            .cloned()
            .collect();
        let from_log = decode_log(&StoredLog { session: group.session.clone(), messages: held });
        assert_eq!(
            events, from_log,
            "{what}: archive message {} holds other events than its log messages",
            m.stream_seq
        );
        last = chunk.last;
    }
    if readable {
        assert_eq!(last, decode_log(group).last().map_or(0, |e| e.seq), "{what}: the archive does not cover the log");
    }
}

/// Checks that every key of `expected` is in `actual` with an equal value, recursively: a field this build
/// added to the fold (absent from an older recording) is not compared, a field it lost is a failure.
fn check_subset(path: &str, expected: &Value, actual: &Value) -> Result<(), String> {
    match (expected, actual) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, w) in want {
                let g = got
                    .get(key)
                    .ok_or_else(|| format!("{path}.{key}: recorded, but this build's fold has no such field"))?;
                check_subset(&format!("{path}.{key}"), w, g)?;
            }
            Ok(())
        }
        (Value::Array(want), Value::Array(got)) => {
            if want.len() != got.len() {
                return Err(format!("{path}: {} items recorded, {} folded", want.len(), got.len()));
            }
            want.iter().zip(got).enumerate().try_for_each(|(i, (w, g))| check_subset(&format!("{path}[{i}]"), w, g))
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: recorded {expected}, folded {actual}")),
    }
}

/// Reads one recording and checks everything the module doc says; returns the durable types it holds.
async fn check_recording(dir: &Path) -> BTreeSet<String> {
    let manifest: Manifest = read_json(&dir.join("manifest.json"));
    let what = dir.display().to_string();
    assert!(!manifest.sessions.is_empty(), "{what}: no sessions");
    let embedded_copy = tempfile::tempdir().unwrap();
    copy_dir(&dir.join("embedded"), embedded_copy.path());
    let embedded = EmbeddedLog::open(embedded_copy.path()).unwrap_or_else(|e| panic!("{what}/embedded: {e}"));
    let mut types = BTreeSet::new();
    for name in &manifest.sessions {
        let session = session_of(name);
        let stem = file_stem(&session);
        let group: StoredLog = read_json(&dir.join("group").join(format!("{stem}.json")));
        let events = decode_log(&group);
        assert!(!events.is_empty(), "{what}: {name} has no events");
        let archive = dir.join("archive").join(format!("{stem}.json"));
        if manifest.archive_format.is_some() {
            check_archive(&format!("{what}: {name}"), &group, &read_json(&archive), &manifest);
        }
        let single = decode_log(&read_json(&dir.join("single").join(format!("{stem}.json"))));
        assert_eq!(single, events, "{what}: {name}: the single-event layout holds other events");
        let from_disk = turnstile_journal::log::read_all(&embedded, &session, 1).await.unwrap();
        assert_eq!(from_disk, events, "{what}: {name}: the embedded journal's files hold other events");
        for e in &events {
            // What this build writes of an old event reads back as the same event.
            assert_eq!(codec::decode_event(&codec::encode_event(e)).unwrap(), *e, "{what}: {name} seq {}", e.seq);
            match &e.payload {
                EventPayload::Ignorable { .. } => {}
                p => {
                    types.insert(p.event_type().to_owned());
                }
            }
        }

        // Every event decodes to the value recorded for it (a decoding change that alters an old event fails
        // here even when the fold does not look at what changed).
        let recorded: Value = read_json(&dir.join("events").join(format!("{stem}.json")));
        check_subset("events", &recorded, &serde_json::to_value(&events).unwrap())
            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        let state = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events)
            .unwrap_or_else(|e| panic!("{what}: {name} does not fold: {e}"));
        let expected: Value = read_json(&dir.join("states").join(format!("{stem}.json")));
        check_subset("state", &expected, &serde_json::to_value(&state).unwrap())
            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));

        // Each snapshot (a full one and its read one, part-way and at the end) loads to the same fold.
        let log = EmbeddedLog::in_memory();
        let mut last = 0;
        for group in by_message(&events) {
            last = log.append(&session, last, group, None).await.unwrap();
        }
        for path in snapshot_files(dir, &session) {
            let bytes = std::fs::read(&path).unwrap();
            let what = path.display();
            let read = path.to_string_lossy().ends_with(".read.json");
            let usable = if read { Snapshot::decode_any(&session, &bytes) } else { Snapshot::decode(&session, &bytes) };
            let Some(snapshot) = usable else {
                // A snapshot of another schema version is ignored (the log is folded from the start), as
                // SNAPSHOT_VERSION's doc says; one of this build's version must load.
                assert_ne!(
                    manifest.snapshot_version, SNAPSHOT_VERSION,
                    "{what}: a snapshot of this build's version must load"
                );
                continue;
            };
            // The snapshot's fold plus the events after it is the log's fold (the reads' view for a read one).
            let mut folded = snapshot.state;
            let tail =
                log.read_after(&session, folded.last_seq, None).await.unwrap().expect("the snapshot is within the log");
            tail.iter().for_each(|e| folded.apply(e).unwrap());
            if read {
                assert_eq!(reads_view(folded), reads_view(state.clone()), "{what}: read snapshot + tail");
            } else {
                assert_eq!(folded, state, "{what}: snapshot + tail");
                // And through the loads an owner and a reader make.
                let snapshots = MemorySnapshots::default();
                snapshots.put_raw(&session, bytes);
                let loaded = load_state(&log, &snapshots, &session, DEFAULT_DEDUP_HORIZON).await.unwrap();
                assert_eq!(loaded, state, "{what}: an owner's load");
                let reads = load_for_reads(&log, &snapshots, &session).await.unwrap();
                assert_eq!(reads.state, reads_view(state.clone()), "{what}: a reader's load");
            }
        }
    }
    types
}

/// The snapshot files of `session` in a recording.
fn snapshot_files(dir: &Path, session: &SessionRef) -> Vec<PathBuf> {
    let prefix = format!("{}@", file_stem(session));
    let Ok(entries) = std::fs::read_dir(dir.join("snapshots")) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
        .collect();
    files.sort();
    files
}

/// `events` cut into runs of one epoch and at most 64 events (appends for a log that keeps no groups).
fn by_message(events: &[Envelope]) -> Vec<&[Envelope]> {
    events.chunk_by(|a, b| a.epoch == b.epoch).flat_map(|run| run.chunks(64)).collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display())) {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The recordings, oldest first (their names sort by date).
fn recordings() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[tokio::test]
async fn every_recording_folds_to_the_state_recorded_with_it() {
    let dirs = recordings();
    assert!(!dirs.is_empty(), "no recording in {}", corpus_root().display());
    let mut newest = BTreeSet::new();
    for dir in &dirs {
        newest = check_recording(dir).await;
    }
    // So must it hold this build's archive format (a format is recorded before it ships).
    let manifest: Manifest = read_json(&dirs.last().unwrap().join("manifest.json"));
    assert_eq!(
        manifest.archive_format,
        Some(ARCHIVE_FORMAT),
        "the newest recording ({}) has no archive of this build's format: record a new one",
        dirs.last().unwrap().display()
    );
    // A recording holds every type its build knew, so the newest must hold every type this build knows:
    // a new durable type is recorded before it ships.
    let missing: Vec<&str> = DURABLE_TYPES.iter().copied().filter(|t| !newest.contains(*t)).collect();
    assert!(
        missing.is_empty(),
        "the newest recording ({}) has no {missing:?} event: record a new one (TURNSTILE_BLESS=1 cargo nextest \
         run -p turnstile-tests -E 'binary(corpus)', see tests/corpus/README.md)",
        dirs.last().unwrap().display()
    );
}

// ---- Recording ---------------------------------------------------------------------------------------

/// Agents for every durable type: tools, an approval, children, a second agent to configure.
const AGENTS: &str = "default_agent = \"careful\"\n\n\
    [journal]\nsnapshot_every = 5\n\n\
    [agents.careful]\ntools = [\"echo\", \"sleep\", \"spawn_agent\", \"memory_put\"]\napproval = [\"sleep\"]\n\
    memory = { namespaces = [\"notes\"] }\n\n\
    [agents.researcher]\nsystem = \"You research.\"\ntools = [\"echo\"]\n\n\
    [agents.researcher.overrides]\nsystem_prompt = true\ntools = true\n\n\
    [agents.slow]\ntools = [\"sleep\"]\n";

const TENANT: &str = "corpus";

fn session(server: &DevServer, id: &str) -> Session {
    Session::with_ref(server.client(), pb::SessionRef { tenant: TENANT.into(), id: id.into() })
}

/// The id of the latest `tool/call` of `s` waiting for approval, once there is one.
async fn awaiting_call(s: &Session) -> String {
    tokio::time::timeout(DEFAULT_WAIT, async {
        loop {
            let (events, _) = s.replay(0).await.unwrap();
            let decided: BTreeSet<String> = events
                .iter()
                .filter_map(|e| match &e.payload {
                    Some(pb::session_event::Payload::ToolDecision(d)) => Some(d.call_id.clone()),
                    _ => None,
                })
                .collect();
            let waiting = events.iter().rev().find_map(|e| match &e.payload {
                Some(pb::session_event::Payload::ToolCall(c))
                    if c.awaiting_approval && !decided.contains(&c.call_id) =>
                {
                    Some(c.call_id.clone())
                }
                _ => None,
            });
            if let Some(call) = waiting {
                return call;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a tool call awaiting approval")
}

/// Waits until the pending steer `id` was dropped by its deadline: a canceled splice of next-step after
/// the splice that inserted it.
async fn dropped(s: &Session, id: &str) {
    tokio::time::timeout(DEFAULT_WAIT, async {
        loop {
            let (events, _) = s.replay(0).await.unwrap();
            let splices = events.iter().filter_map(|e| match &e.payload {
                Some(pb::session_event::Payload::InboxSpliced(splice)) => Some(splice),
                _ => None,
            });
            let mut after_insert = splices.skip_while(|splice| !splice.inserted.iter().any(|m| m.id == id)).skip(1);
            if after_insert.any(|splice| {
                splice.outcome == pb::SpliceOutcome::Canceled as i32 && splice.target == pb::Target::NextStep as i32
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("steer {id} was never dropped by its deadline"));
}

/// Runs the recording scenario: every durable type, most payload variants, a child session, a fork.
async fn scenario(server: &DevServer, nats: &NatsServer) -> Vec<(SessionRef, Vec<u8>, Vec<u8>)> {
    // basics: deliveries of each preset and source, edits, interrupt, cancel, every way a turn ends.
    let basics = session(server, "basics");
    basics.followup(user_msg("a", "hello")).await.unwrap();
    basics.when_idle().await.unwrap();
    basics.queue(user_msg("q1", "later")).await.unwrap();
    basics.queue(plugin_msg("q2", "later too", "notes", "notice")).await.unwrap();
    basics.replace("q1", user_msg("q1", "later, rewritten")).await.unwrap();
    basics.remove("q2").await.unwrap();
    basics.splice(pb::Target::NextTurn, 0, 0, vec![user_msg("x", "spliced in")]).await.unwrap();
    basics.clear().await.unwrap();
    basics.inject(data_msg("i", "application/json", b"{\"k\":1}".to_vec())).await.unwrap();
    basics.followup(user_msg("b", "with context")).await.unwrap();
    basics.when_idle().await.unwrap();
    basics.followup(user_msg("c", "[[delay:2000]] slow")).await.unwrap();
    basics.steer(user_msg("s", "steer in"), None).await.unwrap();
    basics.steer_with_deadline(user_msg("d", "drop me"), Some(50), pb::OnDeadline::Drop as i32).await.unwrap();
    dropped(&basics, "d").await;
    basics.interrupt(user_msg("int", "stop that")).await.unwrap();
    basics.when_idle().await.unwrap();
    for (id, text) in [("mt", "[[max-tokens]] long"), ("f", "[[fail]] broken"), ("r", "[[reject]] refused")] {
        basics.followup(user_msg(id, text)).await.unwrap();
        basics.when_idle().await.unwrap();
    }
    basics.followup(user_msg("slow2", "[[delay:3000]] again")).await.unwrap();
    basics.cancel(false).await.unwrap();
    basics.when_idle().await.unwrap();
    // A snapshot part-way: the log goes on after it.
    let kv = snapshots_bucket(nats).await;
    let midway = read_snapshots(&kv, &basics.reference()).await;
    basics.followup(user_msg("last", "one more")).await.unwrap();
    basics.when_idle().await.unwrap();

    // tools: a call and its result, an approval granted and one denied.
    let tools = session(server, "tools");
    tools.followup(user_msg("t1", "[[tool:echo hi]] use a tool")).await.unwrap();
    tools.when_idle().await.unwrap();
    // memory/written: a write to the tenant's memory (SPEC §20).
    let put = r#"[[tool:memory_put {"namespace": "notes", "key": "gate", "document": {"fact": "north"}}]] remember"#;
    tools.followup(user_msg("t1m", put)).await.unwrap();
    tools.when_idle().await.unwrap();
    tools.followup(user_msg("t2", "[[tool:sleep 10]] wait")).await.unwrap();
    tools.decide(&awaiting_call(&tools).await, true, "fine").await.unwrap();
    tools.when_idle().await.unwrap();
    tools.followup(user_msg("t3", "[[tool:sleep 10]] wait again")).await.unwrap();
    tools.decide(&awaiting_call(&tools).await, false, "not now").await.unwrap();
    tools.when_idle().await.unwrap();

    // goal: rounds until the model completes it, then one set and cleared.
    let goal = session(server, "goal");
    goal.set_goal("count to two [[complete-goal-at:2]]", 3).await.unwrap();
    tokio::time::timeout(DEFAULT_WAIT, async {
        while goal.info().await.ok().and_then(|i| i.goal).is_none_or(|g| g.state != "completed") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the goal completes");
    goal.when_idle().await.unwrap();
    let second = goal.set_goal("and again", 1).await.unwrap();
    goal.update_goal(&second.goal_id, pb::GoalAction::Clear).await.unwrap();
    goal.when_idle().await.unwrap();

    // history: a compaction and a fork.
    let history = session(server, "history");
    history.followup(user_msg("h1", "what is a turnstile?")).await.unwrap();
    history.when_idle().await.unwrap();
    history.followup(user_msg("h2", "[[tool:echo gates]] who made it?")).await.unwrap();
    history.when_idle().await.unwrap();
    history.compact().await.unwrap();
    history.fork(1, "history-fork").await.unwrap();
    let fork = session(server, "history-fork");
    fork.followup(user_msg("f1", "shorter")).await.unwrap();
    fork.when_idle().await.unwrap();

    // parent: a child session (its first event names its parent).
    let parent = session(server, "parent");
    parent.followup(user_msg("p", "[[tool:spawn_agent researcher find the gate]] delegate")).await.unwrap();
    parent.when_idle().await.unwrap();

    // configured: another agent, out-of-turn injects, a cross-session reference.
    let configured = session(server, "configured");
    configured.configure("researcher", pb::InjectMode::OutOfTurn).await.unwrap();
    // session/overridden: an extra system prompt and a tool subset (SPEC §20).
    let overrides = pb::SessionOverrides {
        system_prompt: Some("Cite your sources.".into()),
        model: None,
        tools: Some(pb::ToolSubset { tools: vec!["echo".into()] }),
    };
    let req = pb::ConfigureSessionRequest {
        session: Some(configured.reference()),
        agent: "researcher".into(),
        inject_mode: pb::InjectMode::OutOfTurn as i32,
        overrides: Some(overrides),
        ..Default::default()
    };
    server.client().configure_session(req).await.unwrap();
    configured.inject(user_msg("o", "between turns")).await.unwrap();
    configured.reference_session(history.reference(), Some(1), "ref").await.unwrap();
    configured.followup(user_msg("g", "go")).await.unwrap();
    configured.when_idle().await.unwrap();

    // scheduled: labels set and one removed; a cron schedule created and deleted; a one-shot that fires.
    let scheduled = session(server, "scheduled");
    let mut client = server.client();
    let labels = [("team".to_owned(), "blue".to_owned()), ("old".to_owned(), "x".to_owned())].into();
    client
        .set_labels(pb::SetLabelsRequest { session: Some(scheduled.reference()), labels, remove_keys: vec![] })
        .await
        .unwrap();
    let remove = pb::SetLabelsRequest {
        session: Some(scheduled.reference()),
        labels: Default::default(),
        remove_keys: vec!["old".into()],
    };
    client.set_labels(remove).await.unwrap();
    let schedule = |id: &str, timing: pb::create_schedule_request::Timing| pb::CreateScheduleRequest {
        session: Some(scheduled.reference()),
        schedule_id: id.into(),
        preset: pb::SchedulePreset::Followup.into(),
        message: Some(user_msg("", "scheduled work")),
        // A time zone applies to cron only.
        time_zone: if matches!(timing, pb::create_schedule_request::Timing::Cron(_)) {
            "Europe/Paris".into()
        } else {
            String::new()
        },
        timing: Some(timing),
        not_after_unix_ms: None,
        catchup_ms: 0,
    };
    client
        .create_schedule(schedule("daily", pb::create_schedule_request::Timing::Cron("0 9 * * 1-5".into())))
        .await
        .unwrap();
    client
        .delete_schedule(pb::DeleteScheduleRequest {
            session: Some(scheduled.reference()),
            schedule_id: "daily".into(),
        })
        .await
        .unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let at = pb::create_schedule_request::Timing::AtUnixMs(now_ms + 1_500);
    client.create_schedule(schedule("once", at)).await.unwrap();
    tokio::time::timeout(DEFAULT_WAIT, async {
        loop {
            let listed = pb::ListSchedulesRequest { session: Some(scheduled.reference()), ..Default::default() };
            if client.list_schedules(listed).await.unwrap().into_inner().schedules.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the one-shot schedule fires and is gone");
    scheduled.when_idle().await.unwrap();

    let mut taken = midway;
    taken.extend(read_snapshots(&kv, &basics.reference()).await);
    taken.extend(read_snapshots(&kv, &tools.reference()).await);
    taken
}

/// repaired: the server is killed -9 while a call runs, and the next one repairs it (`tool/repaired`,
/// SPEC §20). Returns the server that repaired it.
async fn crash_mid_call(server: DevServer, nats: &NatsServer, config: &Path) -> DevServer {
    let repaired = session(&server, "repaired");
    repaired.configure("slow", pb::InjectMode::Pending).await.unwrap();
    repaired.followup(user_msg("w", "[[tool:sleep 600000]] long work")).await.unwrap();
    tokio::time::timeout(DEFAULT_WAIT, async {
        loop {
            let (events, _) = repaired.replay(0).await.unwrap();
            if events.iter().any(|e| matches!(e.payload, Some(pb::session_event::Payload::ToolCall(_)))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the call starts");
    server.kill();
    let next = DevServer::start_with(DevOptions { extra_args: config_args(config), ..DevOptions::nats(nats.url()) })
        .await
        .unwrap();
    // The new process resumes the running session: it repairs the call and answers its result.
    session(&next, "repaired").when_idle().await.unwrap();
    next
}

async fn snapshots_bucket(nats: &NatsServer) -> async_nats::jetstream::kv::Store {
    let client = async_nats::connect(nats.url()).await.unwrap();
    async_nats::jetstream::new(client).get_key_value("turnstile_snapshots").await.unwrap()
}

/// The full and the read snapshot of `session` as the KV bucket holds them now.
async fn read_snapshots(
    kv: &async_nats::jetstream::kv::Store,
    session: &pb::SessionRef,
) -> Vec<(SessionRef, Vec<u8>, Vec<u8>)> {
    let key = format!("{}.{}", session.tenant, session.id);
    let full = kv.get(&key).await.unwrap().expect("a snapshot (snapshot_every = 5)");
    let read = kv.get(format!("{key}.read")).await.unwrap().expect("a read snapshot");
    vec![(SessionRef::new(&session.tenant, &session.id).unwrap(), full.to_vec(), read.to_vec())]
}

/// Every message of the event stream, by session, as stored.
async fn read_stream(nats: &NatsServer) -> BTreeMap<SessionRef, Vec<StoredMessage>> {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let stream = async_nats::jetstream::new(client).get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    let mut logs: BTreeMap<SessionRef, Vec<StoredMessage>> = BTreeMap::new();
    let mut seq = 1;
    while let Ok(m) = stream.get_raw_message(seq).await {
        seq += 1;
        let tokens: Vec<&str> = m.subject.split('.').collect();
        let [_, _, _, tenant, id] = tokens[..] else { panic!("unexpected subject {}", m.subject) };
        let headers = m
            .headers
            .iter()
            .filter(|(k, _)| k.to_string().starts_with("Turnstile-"))
            .map(|(k, v)| (k.to_string(), v[0].as_str().to_owned()))
            .collect();
        logs.entry(SessionRef::new(tenant, id).unwrap()).or_default().push(StoredMessage {
            stream_seq: m.sequence,
            headers,
            body: BASE64.encode(&m.payload),
        });
    }
    logs
}

/// The same events as single-event messages (the layout before decision 0021): each event's own bytes.
fn single_layout(messages: &[StoredMessage]) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    for m in messages {
        let group = pb::SessionEventGroup::decode(m.body().as_slice()).unwrap();
        for event in group.events {
            let headers = BTreeMap::from([
                (HEADER_SEQ.to_owned(), event.seq.to_string()),
                (HEADER_TYPE.to_owned(), event.r#type.clone()),
                (HEADER_EPOCH.to_owned(), event.epoch.to_string()),
            ]);
            out.push(StoredMessage {
                stream_seq: out.len() as u64 + 1,
                headers,
                body: BASE64.encode(event.encode_to_vec()),
            });
        }
    }
    out
}

/// `corpus/future`: `template`'s events under another name, then a group holding an event of a type no
/// build knows, marked ignorable and carrying a field none knows, and a known event after it.
fn future_session(template: &[Envelope]) -> (SessionRef, Vec<StoredMessage>) {
    let session = SessionRef::new(TENANT, "future").unwrap();
    let events: Vec<Envelope> = template.iter().map(|e| Envelope { session: session.clone(), ..e.clone() }).collect();
    let mut messages = Vec::new();
    let mut push = |bodies: Vec<Vec<u8>>, headers: HeaderMap| {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v[0].as_str().to_owned())).collect();
        let body = encode_group(bodies.iter().map(Vec::as_slice));
        messages.push(StoredMessage { stream_seq: messages.len() as u64 + 1, headers, body: BASE64.encode(body) });
    };
    for group in by_message(&events) {
        push(group.iter().map(codec::encode_event).collect(), group_headers(group, None));
    }
    let last = events.last().unwrap();
    let mut unknown = pb::SessionEvent {
        session: Some(codec::encode_session_ref(&session)),
        seq: last.seq + 1,
        time_unix_ms: last.time_ms,
        epoch: last.epoch,
        r#type: "future/annotation".into(),
        ignorable: true,
        format: EVENT_FORMAT + 1,
        payload: None,
    }
    .encode_to_vec();
    prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut unknown);
    prost::encoding::encode_varint(4, &mut unknown);
    unknown.extend_from_slice(b"note");
    let after = Envelope {
        seq: last.seq + 2,
        payload: EventPayload::SessionConfigured {
            version: None,
            agent: "scripted".into(),
            inject_mode: turnstile_model::InjectMode::Pending,
            parent: None,
        },
        ..last.clone()
    };
    let marker = Envelope {
        seq: last.seq + 1,
        payload: EventPayload::Ignorable { event_type: "future/annotation".into() },
        ..last.clone()
    };
    let mut headers = group_headers(&[marker, after.clone()], None);
    headers.insert(HEADER_TYPE, "future/annotation,session/configured");
    push(vec![unknown, codec::encode_event(&after)], headers);
    (session, messages)
}

/// Writes a recording of `logs` and `snapshots` into `dir`, with every layout and state derived here.
async fn write_recording(
    dir: &Path,
    logs: &BTreeMap<SessionRef, Vec<StoredMessage>>,
    snapshots: &[(SessionRef, Vec<u8>, Vec<u8>)],
) {
    assert!(!dir.exists(), "{} exists: a recording is never overwritten; record under another name", dir.display());
    let embedded = EmbeddedLog::open(dir.join("embedded")).unwrap();
    let mut sessions = Vec::new();
    for (session, messages) in logs {
        let name = format!("{}/{}", session.tenant, session.id);
        let stem = file_stem(session);
        let stored = StoredLog { session: name.clone(), messages: messages.clone() };
        let events = decode_log(&stored);
        write_json(&dir.join("group").join(format!("{stem}.json")), &stored);
        write_json(
            &dir.join("single").join(format!("{stem}.json")),
            &StoredLog { session: name.clone(), messages: single_layout(messages) },
        );
        write_json(
            &dir.join("archive").join(format!("{stem}.json")),
            &StoredLog { session: name.clone(), messages: archive_layout(&stored, 4) },
        );
        let mut last = 0;
        for m in messages {
            let group = decode_message(session, Some(&m.header_map()), &m.body(), m.stream_seq).unwrap();
            last = embedded.append(session, last, &group, None).await.unwrap();
        }
        let state = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events).unwrap();
        write_json(&dir.join("events").join(format!("{stem}.json")), &events);
        write_json(&dir.join("states").join(format!("{stem}.json")), &state);
        sessions.push(name);
    }
    for (i, (session, full, read)) in snapshots.iter().enumerate() {
        let stem = format!("{}@{}", file_stem(session), i + 1);
        std::fs::create_dir_all(dir.join("snapshots")).unwrap();
        std::fs::write(dir.join("snapshots").join(format!("{stem}.json")), full).unwrap();
        std::fs::write(dir.join("snapshots").join(format!("{stem}.read.json")), read).unwrap();
    }
    // What the binary under test wrote (it may be an older build's, TURNSTILE_BIN), read from what it wrote.
    let recorded_by = std::env::var("TURNSTILE_CORPUS_BUILD").unwrap_or_else(|_| {
        let describe = std::process::Command::new("git").args(["describe", "--always", "--dirty"]).output();
        describe.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
    });
    let recorded = logs.iter().filter(|(s, _)| s.id != "future").flat_map(|(_, m)| m);
    let event_format = recorded
        .clone()
        .flat_map(|m| pb::SessionEventGroup::decode(m.body().as_slice()).unwrap().events)
        .map(|e| e.format)
        .max()
        .unwrap_or_default();
    let group_format = recorded.filter_map(|m| m.headers.get("Turnstile-Format")?.parse().ok()).max().unwrap_or(1);
    let snapshot_version = snapshots
        .iter()
        .map(|(_, full, _)| serde_json::from_slice::<Value>(full).unwrap()["version"].as_u64().unwrap() as u32)
        .max()
        .unwrap_or(SNAPSHOT_VERSION);
    let manifest = Manifest {
        recorded_by,
        event_format,
        group_format,
        snapshot_version,
        archive_format: Some(ARCHIVE_FORMAT),
        sessions,
    };
    write_json(&dir.join("manifest.json"), &manifest);
}

#[tokio::test]
async fn todays_binary_records_every_durable_type() {
    let nats = NatsServer::start().await.unwrap();
    let (_config_dir, config) = config_file(AGENTS);
    let server = DevServer::start_with(DevOptions { extra_args: config_args(&config), ..DevOptions::nats(nats.url()) })
        .await
        .unwrap();
    let snapshots = scenario(&server, &nats).await;
    let server = crash_mid_call(server, &nats, &config).await;
    let mut logs = read_stream(&nats).await;
    server.stop().await;
    assert!(logs.keys().all(|s| s.tenant == TENANT), "only the scenario's sessions: {:?}", logs.keys());
    assert!(logs.len() >= 8, "the scenario's sessions and its child: {:?}", logs.keys());
    let fork = SessionRef::new(TENANT, "history-fork").unwrap();
    let template = decode_log(&StoredLog { session: format!("{TENANT}/history-fork"), messages: logs[&fork].clone() });
    let (future, messages) = future_session(&template);
    logs.insert(future, messages);

    let bless = std::env::var("TURNSTILE_BLESS").is_ok_and(|v| v == "1");
    let scratch = tempfile::tempdir().unwrap();
    let dir = if bless {
        let name = std::env::var("TURNSTILE_CORPUS_NAME").unwrap_or_else(|_| {
            let date = std::process::Command::new("date").arg("+%Y-%m-%d").output().unwrap();
            String::from_utf8_lossy(&date.stdout).trim().to_owned()
        });
        corpus_root().join(name)
    } else {
        scratch.path().join("recording")
    };
    write_recording(&dir, &logs, &snapshots).await;
    let types = check_recording(&dir).await;
    let missing: Vec<&str> = DURABLE_TYPES.iter().copied().filter(|t| !types.contains(*t)).collect();
    assert!(missing.is_empty(), "the recording scenario writes no {missing:?} event: extend `scenario`");
    if bless {
        println!("recorded {}", dir.display());
    }
}
