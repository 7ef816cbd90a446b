//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the matching HTTP
//! status, and the one mapping from the gateway's gRPC statuses to it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tonic::Code;

/// An error answered to an OpenAI client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// What was wrong and how to fix it.
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`, ….
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `invalid_api_key`, or the gRPC code's name).
    pub code: Option<String>,
}

impl ApiError {
    /// A request that breaks a rule of the protocol: 400, naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// An object that does not exist for this caller: 404.
    pub fn not_found(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: Some("not_found".into()),
        }
    }

    /// A `model` that names no agent profile: 404 `model_not_found`, as OpenAI answers.
    pub fn unknown_model(model: &str, known: &[String]) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{model}` does not exist: model names a Turnstile agent profile (known: {}); \
                 GET /v1/models lists them",
                known.join(", ")
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found".into()),
        }
    }

    /// The same error with `param` naming the field it came from, when it named none.
    pub fn at(mut self, param: &str) -> Self {
        if self.param.is_none() {
            self.param = Some(param.to_owned());
        }
        self
    }

    /// The body OpenAI's SDKs parse into their `APIError`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// The gateway's answer as OpenAI's: the code picks the HTTP status and `type`, the message is the
/// gateway's (it already says what was wrong and what to do).
impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        let (http, kind) = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_error"),
            Code::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
            Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => {
                (StatusCode::CONFLICT, "invalid_request_error")
            }
            Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        };
        let code = match status.code() {
            Code::Unauthenticated => "invalid_api_key".to_owned(),
            Code::NotFound => "not_found".to_owned(),
            other => code_name(other).to_owned(),
        };
        Self { status: http, message: status.message().to_owned(), kind, param: None, code: Some(code) }
    }
}

/// The gRPC code in snake case (`resource_exhausted`), as OpenAI's codes are written.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, self.body().to_string()).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_become_openai_statuses_and_types() {
        let e = ApiError::from(tonic::Status::unauthenticated("missing bearer token"));
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert_eq!(e.body()["error"]["type"], "authentication_error");
        assert_eq!(e.body()["error"]["code"], "invalid_api_key");
        assert_eq!(e.body()["error"]["message"], "missing bearer token");
        let e = ApiError::from(tonic::Status::resource_exhausted("slow down")).at("input");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body()["error"]["param"], "input");
        assert_eq!(ApiError::from(tonic::Status::not_found("x")).status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn an_unknown_model_is_404_model_not_found_naming_the_known_ones() {
        let e = ApiError::unknown_model("gpt-4o", &["scripted".into()]);
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let body = e.body();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["param"], "model");
        assert!(body["error"]["message"].as_str().unwrap().contains("scripted"));
    }
}
