//! Checks what docs/SUBJECTS.md tells observers: every durable and live type of the protos has its row (read
//! from the compiled descriptors, so a new payload without a row fails here), the worked partition example
//! (computed by the journal's own functions) and, on a real nats-server with `turnstile dev --nats`, the
//! stored messages of one idle followup (subject, one message per append group with its headers, protobuf
//! body) and the live subjects it publishes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt as _;
use prost::Message as _;
use turnstile_journal::jetstream::subjects;
use turnstile_model::message::SessionRef;
use turnstile_proto::v1 as pb;
use turnstile_tests::nats::NatsServer;
use turnstile_tests::{DevOptions, DevServer, new_session_ref, user_msg};

fn subjects_doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/SUBJECTS.md")).unwrap()
}

/// `(field name, number, message type)` of the `payload` oneof of `turnstile.v1.<message>`.
fn payloads(message: &str) -> Vec<(String, i32, String)> {
    use prost::Message as _;
    let set = prost_types::FileDescriptorSet::decode(turnstile_proto::FILE_DESCRIPTOR_SET).unwrap();
    let file = set.file.iter().find(|f| f.package() == "turnstile.v1" && f.name().ends_with("events.proto")).unwrap();
    let message = file.message_type.iter().find(|m| m.name() == message).unwrap();
    let payload = message.oneof_decl.iter().position(|o| o.name() == "payload").unwrap();
    message
        .field
        .iter()
        .filter(|f| f.oneof_index == Some(i32::try_from(payload).unwrap()))
        .map(|f| (f.name().to_owned(), f.number(), f.type_name().rsplit('.').next().unwrap().to_owned()))
        .collect()
}

/// The table rows of `doc` whose cell `column` is exactly `` `name` (number) ``, as cells.
fn rows_naming<'a>(doc: &'a str, column: usize, name: &str, number: i32) -> Vec<Vec<&'a str>> {
    let cell = format!("`{name}` ({number})");
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.get(column) == Some(&cell.as_str()))
        .collect()
}

#[test]
fn every_durable_and_live_type_of_the_protos_has_a_row() {
    let doc = subjects_doc();
    let mut durable = Vec::new();
    for (field, number, message) in payloads("SessionEvent") {
        let rows = rows_naming(&doc, 1, &field, number);
        assert_eq!(rows.len(), 1, "docs/SUBJECTS.md has one durable row for payload `{field}` ({number})");
        let row = &rows[0];
        assert!(row[2].contains(&message), "the row of `{field}` names its message {message}: {row:?}");
        durable.push(row[0].trim_matches('`').to_owned());
    }
    durable.sort();
    let mut known: Vec<String> = turnstile_model::event::DURABLE_TYPES.iter().map(|t| (*t).to_owned()).collect();
    known.sort();
    assert_eq!(durable, known, "the durable rows name exactly the durable types");

    let mut live = Vec::new();
    for (field, number, message) in payloads("LiveEvent") {
        let rows = rows_naming(&doc, 2, &field, number);
        assert_eq!(rows.len(), 1, "docs/SUBJECTS.md has one live row for payload `{field}` ({number})");
        let row = &rows[0];
        let live_type = row[0].trim_matches('`');
        assert_eq!(row[1], format!("`.{}`", live_type.replace('/', ".")), "the subject suffix of {live_type}");
        assert!(row[3].contains(&message), "the row of `{field}` names its message {message}: {row:?}");
        live.push(live_type.to_owned());
    }
    assert_eq!(live.len(), 6, "{live:?}");
}

#[test]
fn the_worked_example_is_what_the_code_computes() {
    assert_eq!(subjects::fnv1a64(b"acme/sess-1"), 0x2dd1_be46_0085_a094);
    assert_eq!(subjects::fnv1a64(b"acme/sess-1"), 3_301_629_209_705_029_780);
    let s = SessionRef::new("acme", "sess-1").unwrap();
    let shard = subjects::shard_of(&s, 256);
    assert_eq!(shard, 148);
    assert_eq!(subjects::partition_of(shard, 1), 0);
    assert_eq!(subjects::partition_of(shard, 3), 1);
    assert_eq!(subjects::stream_name(1), "TURNSTILE_EVENTS_1");
    assert_eq!(subjects::event_subject(1, &s), "turnstile.ev.1.acme.sess-1");
    assert_eq!(subjects::live_subject(&s, "agent/inbox/claimed"), "turnstile.live.acme.sess-1.agent.inbox.claimed");
    let t = SessionRef::new("default", "s1").unwrap();
    assert_eq!(subjects::fnv1a64(b"default/s1"), 0xe6d2_53c9_e042_1ef3);
    assert_eq!(subjects::shard_of(&t, 256), 243);
    assert_eq!(subjects::partition_of(243, 4), 3);
}

fn header(m: &async_nats::jetstream::message::StreamMessage, name: &str) -> Option<String> {
    m.headers.get(name).map(|v| v.as_str().to_owned())
}

#[tokio::test]
async fn an_idle_followup_on_jetstream_looks_as_documented() {
    let nats = NatsServer::start().await.unwrap();
    let dev = DevServer::start_with(DevOptions { extra_args: vec!["--nats".into(), nats.url()], ..Default::default() })
        .await
        .unwrap();
    let observer = async_nats::connect(nats.url()).await.unwrap();
    let session = new_session_ref();
    let mut live = observer.subscribe(format!("turnstile.live.{}.>", session.tenant)).await.unwrap();
    observer.flush().await.unwrap();

    let mut client = dev.client();
    let reply = client
        .followup(pb::DeliverRequest {
            session: Some(session.clone()),
            message: Some(user_msg("m1", "hi")),
            output_schema: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.turn, Some(1));
    client.when_idle(pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms: 10_000 }).await.unwrap();

    // Durable: stream TURNSTILE_EVENTS_0 (P = 1), one message per append group on the session's subject,
    // body a SessionEventGroup whose seqs and types the headers name.
    let js = async_nats::jetstream::new(observer.clone());
    let stream = js.get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    let subject = format!("turnstile.ev.0.{}.{}", session.tenant, session.id);
    let mut messages = Vec::new();
    let mut durable = Vec::new();
    let mut stream_seq = 1;
    while let Ok(m) = stream.get_raw_message(stream_seq).await {
        stream_seq += 1;
        assert_eq!(m.subject.as_str(), subject);
        let group = pb::SessionEventGroup::decode(m.payload.clone()).unwrap();
        let names: Vec<String> = m.headers.iter().map(|(k, _)| k.to_string()).collect();
        println!(
            "stream seq {}  Turnstile-Seq={}..{} Type={} Epoch={} expected={:?} headers={names:?}",
            m.sequence,
            header(&m, "Turnstile-Seq").unwrap_or_default(),
            header(&m, "Turnstile-Last-Seq").unwrap_or_default(),
            header(&m, "Turnstile-Type").unwrap_or_default(),
            header(&m, "Turnstile-Epoch").unwrap_or_default(),
            header(&m, "Nats-Expected-Last-Subject-Sequence"),
        );
        let (first, last) = (group.events.first().unwrap(), group.events.last().unwrap());
        assert_eq!(header(&m, "Turnstile-Seq"), Some(first.seq.to_string()));
        assert_eq!(header(&m, "Turnstile-Last-Seq"), Some(last.seq.to_string()));
        assert_eq!(header(&m, "Turnstile-Epoch"), Some(last.epoch.to_string()));
        assert_eq!(header(&m, "Turnstile-Format"), Some("1".to_owned()), "the message format (SPEC §18)");
        assert!(group.events.iter().all(|e| e.format == 1), "the event format (SPEC §18)");
        let types: Vec<&str> = group.events.iter().map(|e| e.r#type.as_str()).collect();
        assert_eq!(header(&m, "Turnstile-Type"), Some(types.join(",")));
        // The previous message's stream sequence: the single-writer check of each append.
        assert_eq!(header(&m, "Nats-Expected-Last-Subject-Sequence"), Some((m.sequence - 1).to_string()));
        assert!(header(&m, "Nats-Batch-Id").is_none(), "no atomic batch for a group that fits one message");
        for (event, seq) in group.events.iter().zip(first.seq..) {
            assert_eq!(event.seq, seq, "contiguous seqs");
            assert_eq!(event.session.as_ref(), Some(&session));
            durable.push(event.r#type.clone());
        }
        messages.push(types.len());
    }
    assert_eq!(messages, [4, 2, 4], "three appends: the followup's, the step's opening, the step's end");
    assert_eq!(
        durable,
        [
            "agent/inbox/spliced",
            "agent/status",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end",
            "agent/status",
        ]
    );

    // Live: core NATS, `/` written as `.`, body LiveEvent with after_seq.
    let mut seen = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), live.next()).await {
        let event = pb::LiveEvent::decode(m.payload.clone()).unwrap();
        println!("live {:<58} type={} after_seq={}", m.subject.as_str(), event.r#type, event.after_seq);
        assert_eq!(
            m.subject.as_str(),
            format!("turnstile.live.{}.{}.{}", session.tenant, session.id, event.r#type.replace('/', "."))
        );
        seen.push((event.r#type, event.after_seq));
    }
    let types: Vec<&str> = seen.iter().map(|(t, _)| t.as_str()).collect();
    assert!(types.starts_with(&["agent/inbox/inserted", "agent/status", "agent/inbox/claimed"]), "{types:?}");
    assert_eq!(seen[0].1, 1, "inserted follows the splice (seq 1)");
    assert_eq!(seen[2].1, 4, "claimed follows the claim splice (seq 4)");
    dev.stop().await;
}
