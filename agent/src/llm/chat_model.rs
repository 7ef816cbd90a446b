//! Real providers behind the worker's [`Model`] trait.
//!
//! [`connect`] builds the provider an endpoint names; [`ChatModel`] runs it as a [`Model`]. The driver's
//! [`ModelRequest`] carries the agent's system prompt and the session's history (SPEC §8), which
//! [`ChatModel::chat_request`] maps onto the provider-neutral [`ChatRequest`]: user messages with their
//! content blocks (`image/*` data as images), assistant text with its tool calls, each call's result
//! paired by call id, then this step's messages.
//! Reasoning deltas stream as reasoning, and the reply's reasoning and token usage land in [`ModelOutput`]
//! (and so on the durable `assistant/message`).
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use turnstile_agent::llm::chat_model::{ChatModel, connect};
//! use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
//!
//! let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "SmolLM2-135M-Instruct");
//! endpoint.base_url = "http://127.0.0.1:8080/v1".into();
//! let model = ChatModel::new(connect(endpoint)?).with_system("You are a helpful assistant.");
//! # let _ = model; Ok(()) }
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use std::collections::HashSet;
use tokio_util::sync::CancellationToken;

use metrics::counter;
use turnstile_model::{ContentBlock, MessageId, ModelRef, ToolCallSpec, TranscriptEntry, UserMessage};
use turnstile_ops::names::MODEL_FALLBACKS;

use super::anthropic::AnthropicProvider;
use super::chat::{
    ChatContent, ChatMessage, ChatOutput, ChatProvider, ChatRequest, ChatToolCall, Finish, ProviderError, ToolSpec,
};
use super::endpoint::{EndpointError, ModelEndpoint, ProviderKind};
use super::openai::OpenAiProvider;
use turnstile_driver::{ModelOutput, ModelRequest, SUMMARY_PREFIX, compaction_instruction};
use turnstile_worker::agent::{DeltaSink, Model, ModelError, ModelIdentity, ModelStep};

use crate::tools::ClientBusSlot;

/// The provider `endpoint.provider` names, ready to stream.
pub fn connect(endpoint: ModelEndpoint) -> Result<Arc<dyn ChatProvider>, EndpointError> {
    Ok(match endpoint.provider {
        ProviderKind::OpenAi => Arc::new(OpenAiProvider::new(endpoint)?),
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(endpoint)?),
    })
}

/// A [`ChatProvider`] as a [`Model`], with the agent's system prompt and tools, and the providers its
/// model falls back to (SPEC §17).
#[derive(Clone)]
pub struct ChatModel {
    provider: Arc<dyn ChatProvider>,
    /// Tried in order when a request fails before its first byte for a cause another model may not share
    /// ([`ProviderError::falls_back`]).
    fallback: Vec<Arc<dyn ChatProvider>>,
    system: Option<String>,
    tools: Vec<ToolSpec>,
    /// Client tools the agent lists, offered with the schema their executors registered for the
    /// request's tenant, looked up per request ([`crate::tools::client::offered`]).
    client_tools: Vec<String>,
    client_bus: ClientBusSlot,
}

impl std::fmt::Debug for ChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatModel")
            .field("provider", &self.provider.provider())
            .field("model", &self.provider.model())
            .field("fallback", &self.fallback.iter().map(|p| p.model().to_owned()).collect::<Vec<_>>())
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl ChatModel {
    pub fn new(provider: Arc<dyn ChatProvider>) -> Self {
        Self {
            provider,
            fallback: Vec::new(),
            system: None,
            tools: Vec::new(),
            client_tools: Vec::new(),
            client_bus: ClientBusSlot::default(),
        }
    }

    /// Sends a request that fails before its first byte ([`ProviderError::falls_back`]) to these
    /// providers in order, each with its own retries and timeouts (config `fallback`, SPEC §17).
    pub fn with_fallback(mut self, fallback: Vec<Arc<dyn ChatProvider>>) -> Self {
        self.fallback = fallback;
        self
    }

    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    /// Also offers client tools `names`, described by their executors at request time over `bus` (a tool
    /// with no executor connected, or no bus yet, is not offered).
    pub fn with_client_tools(mut self, names: Vec<String>, bus: ClientBusSlot) -> Self {
        self.client_tools = names;
        self.client_bus = bus;
        self
    }

    /// The chat request for `request` (SPEC §8): the system prompt (the agent's, else this model's), then
    /// the history in log order — user messages with their content blocks, assistant text with its tool
    /// calls, each call followed by its result — then this step's messages.
    ///
    /// Providers refuse a call without a result, so a call the log never answered (a crash between two
    /// calls of one step) gets an error result here. Tool results and an interrupted prompt that the
    /// history does not already hold (a request built without history) are sent the old way: results as
    /// one user message of text, the prompt as user messages.
    pub fn chat_request(&self, request: &ModelRequest) -> ChatRequest {
        let mut messages = Vec::new();
        let mut unanswered: Vec<String> = Vec::new();
        let mut answered: HashSet<&str> = HashSet::new();
        let mut seen_users: HashSet<&MessageId> = HashSet::new();
        if let Some(summary) = &request.summary {
            // SPEC §13: the compacted turns go as one user-role message marked as a summary.
            messages.push(ChatMessage::user_text(format!("{SUMMARY_PREFIX}{summary}")));
        }
        for entry in &request.history {
            match entry.as_ref() {
                TranscriptEntry::User { message, .. } => {
                    close_calls(&mut messages, &mut unanswered);
                    seen_users.insert(&message.id);
                    messages.push(user_message(message));
                }
                TranscriptEntry::Assistant { text, tool_calls, .. } => {
                    close_calls(&mut messages, &mut unanswered);
                    if text.is_empty() && tool_calls.is_empty() {
                        continue;
                    }
                    unanswered = tool_calls.iter().map(|c| c.call_id.clone()).collect();
                    messages.push(ChatMessage::Assistant {
                        text: text.clone(),
                        reasoning: None,
                        tool_calls: tool_calls
                            .iter()
                            .map(|c| ChatToolCall {
                                id: c.call_id.clone(),
                                name: c.name.clone(),
                                arguments_json: c.arguments.clone(),
                            })
                            .collect(),
                    });
                }
                TranscriptEntry::ToolResult { call_id, name, output, error, .. } => {
                    answered.insert(call_id);
                    if let Some(i) = unanswered.iter().position(|c| c == call_id) {
                        unanswered.remove(i);
                        let (output, is_error) = result_text(output, error.as_deref());
                        messages.push(ChatMessage::ToolResult { call_id: call_id.clone(), output, is_error });
                    } else {
                        // A result whose call is not right before it cannot be a `tool` message.
                        close_calls(&mut messages, &mut unanswered);
                        messages.push(ChatMessage::user_text(format!(
                            "Tool results:\n{}",
                            result_line(name, call_id, output, error.as_deref())
                        )));
                    }
                }
            }
        }
        close_calls(&mut messages, &mut unanswered);
        let history_len = messages.len();
        let lines: Vec<String> = request
            .tool_results
            .iter()
            .filter(|r| !answered.contains(r.call_id.as_str()))
            .map(|r| result_line(&r.name, &r.call_id, &r.output, r.error.as_deref()))
            .collect();
        if !lines.is_empty() {
            messages.push(ChatMessage::user_text(format!("Tool results:\n{}", lines.join("\n"))));
        }
        let prompt = request.interrupted_prompt.iter().filter(|m| !seen_users.contains(&m.id)).chain(&request.messages);
        messages.extend(prompt.map(user_message));
        if let Some(task) = &request.compaction {
            // A compaction request asks for the summary and offers no tools.
            messages.push(ChatMessage::user_text(compaction_instruction(task)));
            return ChatRequest { messages, history_len, ..ChatRequest::default() };
        }
        let mut tools = self.tools.clone();
        tools.extend(request.goal.as_ref().map(crate::tools::goal_complete_spec));
        tools.extend(turn_tools(request));
        ChatRequest {
            system: request.system.clone().or_else(|| self.system.clone()),
            messages,
            tools,
            max_tokens: None,
            output: request.output.clone(),
            history_len,
        }
    }

    /// Streams `chat` on the model, then on its fallbacks while a request fails before its first byte for
    /// a cause another model may not share. The answer names the model that gave it.
    async fn stream(
        &self,
        chat: &ChatRequest,
        sink: &DeltaSink,
        abort: &CancellationToken,
    ) -> Result<(ChatOutput, ModelRef), ProviderError> {
        let chain: Vec<Arc<dyn ChatProvider>> =
            std::iter::once(self.provider.clone()).chain(self.fallback.iter().cloned()).collect();
        let mut tried = 0;
        loop {
            let provider = &chain[tried];
            tried += 1;
            match provider.stream(chat, sink, abort).await {
                Ok(output) => return Ok((output, ModelRef::new(provider.provider(), provider.model()))),
                Err(error) if error.falls_back() && !abort.is_cancelled() && tried < chain.len() => {
                    tracing::warn!(
                        from = provider.model(),
                        to = chain[tried].model(),
                        code = error.code(),
                        %error,
                        "model request failed before its first byte; trying the next model of the fallback list"
                    );
                    counter!(MODEL_FALLBACKS, "provider" => provider.provider(), "model" => provider.model().to_owned(),
                        "code" => error.code())
                    .increment(1);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// A reply given as a call of the output tool (Anthropic's forced tool, SPEC §20) becomes the reply's
/// text: the call's input is the JSON answer. It was streamed as tool input, not as text, so it goes to
/// the sink now as the reply's one text delta (the deltas of a message concatenate to its text).
async fn output_tool_as_text(output: &mut ChatOutput, name: &str, deltas: &DeltaSink) {
    let Some(i) = output.tool_calls.iter().position(|c| c.name == name) else { return };
    let call = output.tool_calls.remove(i);
    if output.tool_calls.is_empty() && output.finish == Finish::ToolCalls {
        output.finish = Finish::Stop;
    }
    deltas.send(call.arguments_json.clone()).await;
    output.text.push_str(&call.arguments_json);
}

/// Gives every call of the last assistant message that has no result an error result.
fn close_calls(messages: &mut Vec<ChatMessage>, unanswered: &mut Vec<String>) {
    for call_id in unanswered.drain(..) {
        messages.push(ChatMessage::ToolResult {
            call_id,
            output: "no result was recorded for this call (the worker running it stopped)".into(),
            is_error: true,
        });
    }
}

/// A tool result as the model sees it: the error first when the call failed, then any partial output.
fn result_text(output: &str, error: Option<&str>) -> (String, bool) {
    match error {
        None => (output.to_owned(), false),
        Some(e) if output.is_empty() => (e.to_owned(), true),
        Some(e) => (format!("{e}\n{output}"), true),
    }
}

fn result_line(name: &str, call_id: &str, output: &str, error: Option<&str>) -> String {
    match error {
        Some(error) => format!("- {name} ({call_id}) failed: {error}"),
        None => format!("- {name} ({call_id}): {output}"),
    }
}

/// The client tools of the request's turn (SPEC §19): declared by the messages the turn entered (or, for a
/// turn resumed after a failover, the turn it resumes), offered beside the agent's own; a call of one waits
/// for its client (the driver writes it `awaiting_client`, by the same rule).
fn turn_tools(request: &ModelRequest) -> Vec<ToolSpec> {
    let history = request.history.iter().map(AsRef::as_ref);
    turnstile_model::turn_tools::of_turn(history, request.turn, &request.messages)
        .into_iter()
        .map(|tool| ToolSpec { name: tool.name, description: tool.description, input_schema: tool.parameters })
        .collect()
}

/// A message as the model sees it: its blocks, but not the declarations of its turn's client tools and
/// output schema.
fn user_message(message: &UserMessage) -> ChatMessage {
    let content = message
        .content
        .iter()
        .filter(|block| {
            !turnstile_model::turn_tools::is_declaration(block) && !turnstile_model::output::is_declaration(block)
        })
        .map(|block| match block {
            ContentBlock::Text { text } => ChatContent::Text(text.clone()),
            ContentBlock::Data { mime, bytes } => ChatContent::Data { mime: mime.clone(), bytes: bytes.clone() },
        })
        .collect();
    ChatMessage::User { content }
}

#[async_trait]
impl Model for ChatModel {
    fn identity(&self, _agent: &str) -> ModelIdentity {
        ModelIdentity::new(self.provider.provider(), self.provider.model())
    }

    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
        let ModelStep { request, deltas, abort } = step;
        let mut chat = self.chat_request(&request);
        if request.compaction.is_none()
            && !self.client_tools.is_empty()
            && let Some(bus) = self.client_bus.get()
        {
            let offered =
                crate::tools::client::offered(bus.as_ref(), &request.session.tenant, &self.client_tools).await;
            chat.tools.extend(offered);
        }
        // The provider sends straight to the runner's bounded sink: no queue of its own in between.
        let result = self.stream(&chat, &deltas, &abort).await;
        match result {
            Ok((mut output, model)) => {
                if let Some(schema) = &chat.output {
                    output_tool_as_text(&mut output, &schema.name, &deltas).await;
                }
                Ok(ModelOutput {
                    text: output.text,
                    tool_calls: output
                        .tool_calls
                        .into_iter()
                        .map(|c| ToolCallSpec { call_id: c.id, name: c.name, arguments: c.arguments_json })
                        .collect(),
                    max_tokens: output.finish == Finish::Length,
                    reasoning: output.reasoning,
                    usage: output.usage,
                    model: Some(model),
                    invalid_output: None,
                })
            }
            Err(ProviderError::Aborted { .. }) => Err(ModelError::Aborted),
            Err(error) => Err(ModelError::Failed { message: error.to_string(), code: error.code().to_owned() }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use turnstile_driver::ToolOutcome;

    fn model() -> ChatModel {
        let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "m");
        endpoint.base_url = "http://127.0.0.1:1/v1".into();
        ChatModel::new(connect(endpoint).unwrap()).with_system("model default")
    }

    fn request(history: Vec<TranscriptEntry>, messages: Vec<UserMessage>) -> ModelRequest {
        ModelRequest {
            system: Some("You are helpful.".into()),
            history: history.into_iter().map(std::sync::Arc::new).collect(),
            ..crate::fixtures::model_request("assistant", messages)
        }
    }

    fn call(id: &str) -> ToolCallSpec {
        ToolCallSpec { call_id: id.into(), name: "clock".into(), arguments: "{}".into() }
    }

    fn result(id: &str, output: &str, error: Option<&str>) -> TranscriptEntry {
        TranscriptEntry::ToolResult {
            turn: 1,
            step: 1,
            call_id: id.into(),
            name: "clock".into(),
            output: output.into(),
            error: error.map(Into::into),
        }
    }

    #[test]
    fn the_turns_declared_client_tools_are_offered_and_their_declaration_is_not_content() {
        use turnstile_model::turn_tools::{self, TurnTool};
        let tool =
            |name: &str| TurnTool { name: name.into(), description: "d".into(), parameters: serde_json::json!({}) };
        let declaring = |id: &str, name: &str| {
            let mut m = UserMessage::user_text(id, "ask");
            m.push_block(turn_tools::block(&[tool(name)]));
            m
        };
        // A tool an earlier turn declared is not offered; one this turn's entered message declared is, as is
        // one the step's own message declares.
        let history = vec![
            TranscriptEntry::User { turn: 1, step: 1, message: declaring("m0", "old") },
            TranscriptEntry::User { turn: 2, step: 1, message: declaring("m1", "get_weather") },
        ];
        let mut step = request(history, vec![declaring("m2", "lookup")]);
        step.step = 2;
        let chat = model().chat_request(&step);
        let names: Vec<&str> = chat.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "lookup"]);
        assert!(chat.messages.iter().all(|m| match m {
            ChatMessage::User { content } => content == &vec![ChatContent::Text("ask".into())],
            _ => true,
        }));
    }

    #[test]
    fn maps_system_history_with_paired_tool_calls_then_the_step() {
        let image = UserMessage {
            id: MessageId("m1".into()),
            content: vec![
                ContentBlock::text("what is this?"),
                ContentBlock::Data { mime: "image/png".into(), bytes: vec![1, 2] },
            ]
            .into(),
            source: turnstile_model::MessageSource::User,
        };
        let history = vec![
            TranscriptEntry::User { turn: 1, step: 1, message: image },
            TranscriptEntry::Assistant {
                turn: 1,
                step: 1,
                text: "checking".into(),
                tool_calls: vec![call("c1"), call("c2")],
                interrupted: false,
            },
            result("c1", "12:00", None),
            result("c2", "", Some("tool_timeout")),
            TranscriptEntry::Assistant {
                turn: 1,
                step: 2,
                text: "noon".into(),
                tool_calls: vec![],
                interrupted: false,
            },
        ];
        let chat = model().chat_request(&request(history, vec![UserMessage::user_text("m2", "thanks")]));
        assert_eq!(chat.system.as_deref(), Some("You are helpful."));
        assert_eq!(
            chat.messages,
            vec![
                ChatMessage::User {
                    content: vec![
                        ChatContent::Text("what is this?".into()),
                        ChatContent::Data { mime: "image/png".into(), bytes: vec![1, 2] },
                    ]
                },
                ChatMessage::Assistant {
                    text: "checking".into(),
                    reasoning: None,
                    tool_calls: vec![
                        ChatToolCall { id: "c1".into(), name: "clock".into(), arguments_json: "{}".into() },
                        ChatToolCall { id: "c2".into(), name: "clock".into(), arguments_json: "{}".into() },
                    ],
                },
                ChatMessage::ToolResult { call_id: "c1".into(), output: "12:00".into(), is_error: false },
                ChatMessage::ToolResult { call_id: "c2".into(), output: "tool_timeout".into(), is_error: true },
                ChatMessage::assistant_text("noon"),
                ChatMessage::user_text("thanks"),
            ]
        );
        assert!(matches!(&chat.messages[0], ChatMessage::User { content } if content[1].as_image().is_some()));
    }

    #[test]
    fn an_unanswered_call_gets_an_error_result_and_answered_results_are_not_repeated() {
        let history = vec![
            TranscriptEntry::User { turn: 1, step: 1, message: UserMessage::user_text("m1", "time?") },
            TranscriptEntry::Assistant {
                turn: 1,
                step: 1,
                text: String::new(),
                tool_calls: vec![call("c1"), call("c2")],
                interrupted: false,
            },
            result("c1", "12:00", None),
        ];
        let mut r = request(history, vec![]);
        r.system = None;
        r.tool_results = vec![ToolOutcome::new("c1", "clock", "12:00".into(), None)];
        // On resume the interrupted prompt is already in the history.
        r.interrupted_prompt = vec![UserMessage::user_text("m1", "time?")];
        let chat = model().chat_request(&r);
        assert_eq!(chat.system.as_deref(), Some("model default"));
        assert_eq!(chat.messages.len(), 4, "{:?}", chat.messages);
        assert!(
            matches!(&chat.messages[2], ChatMessage::ToolResult { call_id, is_error: false, .. } if call_id == "c1")
        );
        assert!(
            matches!(&chat.messages[3], ChatMessage::ToolResult { call_id, is_error: true, .. } if call_id == "c2")
        );
    }

    #[test]
    fn without_history_tool_results_and_the_interrupted_prompt_go_as_user_text() {
        let mut r = request(vec![], vec![]);
        r.tool_results = vec![ToolOutcome::new("c1", "clock", String::new(), Some("boom".into()))];
        r.interrupted_prompt = vec![UserMessage::user_text("m1", "still there?")];
        let chat = model().chat_request(&r);
        assert_eq!(
            chat.messages,
            vec![
                ChatMessage::user_text("Tool results:\n- clock (c1) failed: boom"),
                ChatMessage::user_text("still there?"),
            ]
        );
    }

    #[test]
    fn goal_complete_is_offered_only_with_an_active_goal() {
        let r = request(vec![], vec![UserMessage::user_text("m1", "hi")]);
        assert!(model().chat_request(&r).tools.is_empty());
        let mut r = r;
        r.goal = Some(turnstile_driver::ActiveGoal {
            goal_id: "g".into(),
            revision: 1,
            objective: "write the report".into(),
            round: 2,
            max_rounds: 5,
        });
        let tools = model().chat_request(&r).tools;
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "goal_complete");
        assert!(tools[0].description.contains("round 2 of at most 5): write the report"), "{}", tools[0].description);
        assert_eq!(tools[0].input_schema["required"], serde_json::json!(["summary"]));
    }

    /// Records the tool names of each request.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<Vec<String>>>);

    #[async_trait]
    impl ChatProvider for Recording {
        fn provider(&self) -> &'static str {
            "openai"
        }
        fn model(&self) -> &str {
            "m"
        }
        async fn stream(
            &self,
            request: &ChatRequest,
            _sink: &DeltaSink,
            _cancel: &CancellationToken,
        ) -> Result<ChatOutput, ProviderError> {
            self.0.lock().unwrap().push(request.tools.iter().map(|t| t.name.clone()).collect());
            Ok(ChatOutput { text: "ok".into(), reasoning: None, tool_calls: vec![], finish: Finish::Stop, usage: None })
        }
    }

    /// Serves `lookup` for tenant `acme` only.
    #[derive(Debug)]
    struct AcmeLookup;

    #[async_trait]
    impl turnstile_cluster::ToolBus for AcmeLookup {
        async fn call(
            &self,
            task: turnstile_proto::v1::ToolCallTask,
            _wait: std::time::Duration,
        ) -> Result<turnstile_proto::v1::ToolCallResult, turnstile_cluster::ToolBusError> {
            Err(turnstile_cluster::ToolBusError::NoExecutor(task.name))
        }
        async fn cancel(&self, _task: turnstile_proto::v1::ToolCallTask) {}
        async fn spec(
            &self,
            tenant: &str,
            tool: &str,
        ) -> Result<Option<turnstile_proto::v1::ClientToolSpec>, turnstile_cluster::ToolBusError> {
            Ok((tenant == "acme" && tool == "lookup").then(|| turnstile_proto::v1::ClientToolSpec {
                name: tool.into(),
                description: "finds".into(),
                input_schema_json: r#"{"type":"object"}"#.into(),
            }))
        }
    }

    #[tokio::test]
    async fn client_tools_are_offered_with_the_schema_registered_for_the_requests_tenant() {
        let provider = Arc::new(Recording::default());
        let slot = ClientBusSlot::default();
        let model = ChatModel::new(provider.clone())
            .with_tools(vec![ToolSpec {
                name: "clock".into(),
                description: String::new(),
                input_schema: serde_json::json!({}),
            }])
            .with_client_tools(vec!["lookup".into(), "gone".into()], slot.clone());
        let run = |tenant: &str| {
            let mut r = request(vec![], vec![UserMessage::user_text("m1", "hi")]);
            r.session.tenant = tenant.into();
            let (tx, _rx) = tokio::sync::mpsc::channel(16);
            model.step(ModelStep::new(r, DeltaSink::new(tx), CancellationToken::new()))
        };
        // No bus yet: only the static tools.
        run("acme").await.unwrap();
        let _ = slot.set(Arc::new(AcmeLookup));
        run("acme").await.unwrap();
        run("other").await.unwrap();
        assert_eq!(
            *provider.0.lock().unwrap(),
            vec![vec!["clock".to_owned()], vec!["clock".to_owned(), "lookup".to_owned()], vec!["clock".to_owned()]]
        );
    }
}
