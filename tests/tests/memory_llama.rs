//! SPEC §20 memory with a real model (issue 42's done-when "once with llama.cpp"), as far as SmolLM2-135M
//! allows: a fact stored with `memory_put` in one session is found with `memory_search` in a new session
//! of the tenant, and llama.cpp's model answers the question from what the search returned.
//!
//! The tool calls themselves are the scripted model's: llama-server (11434) does not put the request's
//! `tools` into SmolLM2's prompt (the prompt of a request with one tool and `tool_choice: "required"`,
//! with or without `--jinja`, is 40 tokens, the same as without the tool) and the model answers in prose, so
//! no test can make it call a tool. A larger model with a tool-calling template would. The 135M model is
//! also sensitive to wording: "What is the name of Ada's cat?" gets `The name of Ada's cat is "Turing".`
//! at temperature 0, "What is Ada's cat called?" gets a story about Ada Lovelace.
//!
//! Needs `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (`source .ci/test-env.sh`), as the other llama tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::transcript_item::Item;
use turnstile_proto::v1::{ConfigureSessionRequest, DeliverRequest, GetTranscriptRequest, SessionRef, WhenIdleRequest};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::llama::{LlamaServer, RecordingProxy, SMOLLM2_MODEL};
use turnstile_tests::{DevOptions, DevServer, user_msg};

fn own(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

/// Runs one turn of `text` in `id` on `agent` to its end (a real model on a busy machine may need more
/// than one WhenIdle wait) and returns the session's transcript items.
async fn turn(c: &mut AgentClient<tonic::transport::Channel>, id: &str, agent: &str, text: &str) -> Vec<Item> {
    let configure = ConfigureSessionRequest { session: own(id), agent: agent.into(), ..Default::default() };
    c.configure_session(configure).await.unwrap();
    let message = user_msg(&uuid::Uuid::new_v4().to_string(), text);
    c.followup(DeliverRequest { session: own(id), message: Some(message), output_schema: None }).await.unwrap();
    let mut idle = false;
    for _ in 0..4 {
        match c.when_idle(WhenIdleRequest { session: own(id), timeout_ms: 30_000 }).await {
            Ok(_) => {
                idle = true;
                break;
            }
            Err(status) if status.code() == Code::DeadlineExceeded => {}
            Err(status) => panic!("{status}"),
        }
    }
    assert!(idle, "{id} not idle within 2 min");
    let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
    c.get_transcript(req).await.unwrap().into_inner().items.into_iter().filter_map(|i| i.item).collect()
}

#[tokio::test]
async fn a_fact_put_in_one_session_is_searched_in_another_and_llama_cpp_answers_from_it() {
    let llama = LlamaServer::start().await.unwrap();
    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    let toml = format!(
        r#"[models.local]
provider = "openai"
base_url = "{base_url}"
model = "{SMOLLM2_MODEL}"
max_tokens = 40
retries = 0

[agents.keeper]
tools = ["memory_put", "memory_search"]
memory = {{ namespaces = ["facts"] }}

[agents.reader]
model = "local"
system = "You answer from the facts you are given."
"#,
        base_url = proxy.base_url(),
    );
    let (_dir, config) = config_file(&toml);
    let opts = DevOptions { extra_args: config_args(&config), ..DevOptions::default() };
    let server = DevServer::start_with(opts).await.unwrap();
    let context = || format!("--- turnstile dev\n{}\n--- llama-server\n{}", server.log_tail(), llama.log_tail());
    let mut c = server.client();

    let put = r#"[[tool:memory_put {"namespace": "facts", "key": "pets/ada", "document": {"fact": "Ada's cat is named Turing"}}]]"#;
    turn(&mut c, "s1", "keeper", put).await;
    // A new session searches by words...
    let items = turn(&mut c, "s2", "keeper", r#"[[tool:memory_search {"query": "Ada cat"}]]"#).await;
    let found = items
        .iter()
        .find_map(|i| match i {
            Item::ToolResult(r) => Some(r.output.clone()),
            _ => None,
        })
        .expect("memory_search's result");
    assert!(found.contains("Ada's cat is named Turing"), "{found}");
    // ...and the real model, asked in that session, answers from what the search found.
    let items = turn(&mut c, "s2", "reader", "What is the name of Ada's cat?").await;
    let answer = items
        .iter()
        .filter_map(|i| match i {
            Item::Assistant(a) => Some(a.text.clone()),
            _ => None,
        })
        .next_back()
        .unwrap();
    eprintln!("llama.cpp answered {answer:?}");
    assert!(answer.contains("Turing"), "{answer:?}\n{}", context());
    // The model's request carried the search and its result.
    let requests = proxy.chat_requests();
    let sent = requests.last().unwrap().to_string();
    assert!(sent.contains("memory_search") && sent.contains("Turing"), "{sent}");
}
