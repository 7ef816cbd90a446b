//! LLM providers: what answers a step's model request over HTTP. Each provider ([`openai`], [`anthropic`])
//! streams a provider-neutral [`chat::ChatRequest`] ([`http`] holds what both share: retries, timeouts, the
//! SSE stream); [`chat_model`] runs one as the worker's [`Model`](turnstile_worker::agent::Model), mapping the
//! driver's request onto it.

pub mod anthropic;
pub mod chat;
pub mod chat_model;
pub mod endpoint;
pub mod http;
pub mod openai;
pub mod retry;
