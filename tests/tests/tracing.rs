//! Distributed tracing end to end: one followup through a real `turnstile gateway` and `turnstile worker`
//! exporting to a test OTLP collector is one trace, the client's, across both processes and on the
//! `traceparent` header of every NATS event it wrote.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use async_nats::jetstream;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures::StreamExt as _;
use turnstile_proto::v1::DeliverRequest;
use turnstile_tests::otlp::{CollectedSpan, OtlpCollector};
use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT, Session, new_session_ref, user_msg};

const GATEWAY_SERVICE: &str = "tracing-test-gateway";
const WORKER_SERVICE: &str = "tracing-test-worker";

fn otel_env(collector: &OtlpCollector, service: &str) -> Vec<(String, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), collector.endpoint()),
        ("OTEL_SERVICE_NAME".into(), service.into()),
        // Export every 100 ms: the test waits for spans, and SIGKILLed processes never flush.
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
    ]
}

fn names_of<'a>(spans: &'a [CollectedSpan], service: &str, trace_id: &str) -> BTreeSet<&'a str> {
    spans.iter().filter(|s| s.service == service && s.trace_id == trace_id).map(|s| s.name.as_str()).collect()
}

/// `(type, traceparent)` of every stored event of `session`, in order.
async fn stored_events(cluster: &Cluster, subject: String) -> Vec<(String, Option<String>)> {
    let client = async_nats::connect(cluster.nats().url()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js.get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    let consumer =
        stream.create_consumer(OrderedConfig { filter_subject: subject, ..Default::default() }).await.unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut out = Vec::new();
    loop {
        let message = tokio::time::timeout(DEFAULT_WAIT, messages.next()).await.unwrap().unwrap().unwrap();
        let header = |name: &str| message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_owned());
        out.push((header("Turnstile-Type").unwrap_or_default(), header("traceparent")));
        if message.info().unwrap().pending == 0 {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_followup_is_one_trace_across_gateway_worker_and_nats() {
    let collector = OtlpCollector::start().await.unwrap();
    let mut opts = ClusterOptions::new(1, 1);
    opts.gateway_env = otel_env(&collector, GATEWAY_SERVICE);
    opts.worker_env = otel_env(&collector, WORKER_SERVICE);
    let cluster = Cluster::start_with(opts).await.unwrap();

    // The client's own trace: a fresh trace id, a made-up client span, sampled.
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let client_span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let session = new_session_ref();
    let mut request = tonic::Request::new(DeliverRequest {
        session: Some(session.clone()),
        message: Some(user_msg("m1", "hello, traced")),
        output_schema: None,
    });
    request.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    cluster.client(0).followup(request).await.unwrap();
    Session::with_ref(cluster.client(0), session.clone()).when_idle().await.unwrap();

    // Both processes export spans of the client's trace: the gateway its RPC, command and routing
    // spans (the RPC's parent is the client's span), the worker its RPC, command, turn, step, model request
    // and appends.
    let spans = collector
        .wait_for("spans of both processes in the client's trace", DEFAULT_WAIT, |spans| {
            let worker = names_of(spans, WORKER_SERVICE, &trace_id);
            let gateway = names_of(spans, GATEWAY_SERVICE, &trace_id);
            ["route", "command"].iter().all(|n| gateway.contains(n))
                && ["turn", "step", "model.request", "journal.append", "runner.command"]
                    .iter()
                    .all(|n| worker.contains(n))
        })
        .await
        .unwrap();
    let gateway_rpc = spans
        .iter()
        .find(|s| s.service == GATEWAY_SERVICE && s.name == "/turnstile.v1.Agent/Followup" && s.trace_id == trace_id)
        .expect("the gateway's Followup span in the client's trace");
    assert_eq!(gateway_rpc.parent_span_id, client_span, "the gateway's RPC span is a child of the client's");
    let worker_rpc = spans
        .iter()
        .find(|s| {
            s.service == WORKER_SERVICE && s.name == "/turnstile.cluster.v1.Worker/Execute" && s.trace_id == trace_id
        })
        .expect("the worker's Execute span in the client's trace");
    let route = spans.iter().find(|s| s.service == GATEWAY_SERVICE && s.name == "route" && s.trace_id == trace_id);
    assert_eq!(Some(&worker_rpc.parent_span_id), route.map(|r| &r.span_id), "the worker's span is the route's child");
    let in_trace =
        |name: &str| spans.iter().find(|s| s.service == WORKER_SERVICE && s.name == name && s.trace_id == trace_id);
    let (step, model) = (in_trace("step").expect("a step span"), in_trace("model.request").expect("a model span"));
    assert_eq!(model.parent_span_id, step.span_id, "a model request's span is a child of its step's");

    // Every append the followup wrote (splice, status, turn/start, step/start, … turn/end, idle status)
    // carries the same trace on its NATS headers, so an observer can join it.
    let subject = format!("turnstile.ev.0.{}.{}", session.tenant, session.id);
    let events = stored_events(&cluster, subject).await;
    // A message holds one append group: its `Turnstile-Type` lists the group's types (decision 0021).
    let types: Vec<&str> = events.iter().flat_map(|(t, _)| t.split(',')).collect();
    for wanted in ["agent/inbox/spliced", "turn/start", "step/start", "assistant/message", "turn/end"] {
        assert!(types.contains(&wanted), "no {wanted} among {types:?}");
    }
    for (event_type, tp) in &events {
        let tp = tp.as_deref().unwrap_or_else(|| panic!("{event_type} has no traceparent header"));
        assert_eq!(
            turnstile_ops::trace::trace_id_of(tp),
            Some(trace_id.as_str()),
            "{event_type} carries {tp}, not trace {trace_id}"
        );
    }
    // And the header names a span a process exported (the append that wrote the event).
    let first = events[0].1.as_deref().and_then(|tp| tp.split('-').nth(2)).unwrap().to_owned();
    let spans = collector
        .wait_for("the span the first event's traceparent names", DEFAULT_WAIT, |spans| {
            spans.iter().any(|s| s.span_id == first)
        })
        .await
        .unwrap();
    let named = spans.iter().find(|s| s.span_id == first).unwrap();
    assert_eq!((named.service.as_str(), named.name.as_str()), (WORKER_SERVICE, "journal.append"));
    if std::env::var_os("TRACING_TEST_DUMP").is_some() {
        for s in spans.iter().filter(|s| s.trace_id == trace_id) {
            eprintln!("{} {} {} <- {}", s.service, s.name, s.span_id, s.parent_span_id);
        }
        eprintln!("{events:#?}");
    }
}
