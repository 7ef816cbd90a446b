//! JSON-RPC 2.0 as A2A v1.0 uses it: a request, a result or an error with A2A's codes, and the gateway's
//! refusals mapped onto them.

use serde_json::{Map, Value, json};
use tonic::Code;

use crate::api::ProtocolError;

/// A2A's error codes (the specification's JSON-RPC mapping).
pub(crate) mod code {
    pub(crate) const PARSE: i64 = -32700;
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    pub(crate) const INTERNAL: i64 = -32603;
    pub(crate) const TASK_NOT_FOUND: i64 = -32001;
    pub(crate) const TASK_NOT_CANCELABLE: i64 = -32002;
    pub(crate) const UNSUPPORTED: i64 = -32004;
    pub(crate) const CONTENT_TYPE: i64 = -32005;
    pub(crate) const NO_EXTENDED_CARD: i64 = -32007;
}

/// An error answered to an A2A client: a code, a message that says what was wrong and what to do, and
/// the gateway's gRPC code as `data` when it came from the gateway.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    pub(crate) fn task_not_found(id: &str) -> Self {
        Self::new(code::TASK_NOT_FOUND, format!("no task {id:?}: task ids are the `id`s of tasks this agent returned"))
    }

    pub(crate) fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

/// The gateway's answer as A2A's: NOT_FOUND is a task that does not exist (another tenant's session is
/// answered as one that does not exist, so nothing is revealed), bad input is invalid params, the rest
/// internal with the gRPC code in `data`.
impl From<tonic::Status> for RpcError {
    fn from(status: tonic::Status) -> Self {
        let code = match status.code() {
            Code::NotFound => code::TASK_NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition | Code::AlreadyExists => {
                code::INVALID_PARAMS
            }
            _ => code::INTERNAL,
        };
        let data = json!({"grpc_code": format!("{:?}", status.code())});
        Self { code, message: status.message().to_owned(), data: Some(data) }
    }
}

impl ProtocolError for RpcError {}

/// A JSON-RPC request.
#[derive(Debug)]
pub(crate) struct Request {
    /// Echoed in the answer (a string, a number or null).
    pub(crate) id: Value,
    pub(crate) method: String,
    pub(crate) params: Map<String, Value>,
}

impl Request {
    /// The request in `body`, or the error to answer (with the id when one was read).
    pub(crate) fn read(body: &[u8]) -> Result<Self, (Value, RpcError)> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| (Value::Null, RpcError::new(code::PARSE, format!("the body is not JSON: {e}"))))?;
        let Value::Object(mut object) = value else {
            return Err((Value::Null, RpcError::new(code::INVALID_REQUEST, "send one JSON-RPC 2.0 request object")));
        };
        let id = object.remove("id").unwrap_or(Value::Null);
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err((id, RpcError::new(code::INVALID_REQUEST, "jsonrpc must be \"2.0\"")));
        }
        let Some(Value::String(method)) = object.remove("method") else {
            return Err((id, RpcError::new(code::INVALID_REQUEST, "method is required: a string such as SendMessage")));
        };
        let params = match object.remove("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params,
            Some(_) => return Err((id, RpcError::invalid("params must be an object"))),
        };
        Ok(Self { id, method, params })
    }
}

/// A result answer.
pub(crate) fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error answer.
pub(crate) fn error(id: &Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.body()})
}

/// Reading params: each getter names the field at fault.
pub(crate) fn string<'a>(params: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(RpcError::invalid(format!("{name} must be a string"))),
    }
}

pub(crate) fn number(params: &Map<String, Value>, name: &str) -> Result<Option<u64>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        // Proto JSON may write 64-bit integers as strings; A2A's are 32-bit but accept both.
        Some(Value::String(s)) => {
            s.parse().map(Some).map_err(|_| RpcError::invalid(format!("{name} must be a non-negative integer")))
        }
        Some(v) => {
            v.as_u64().map(Some).ok_or_else(|| RpcError::invalid(format!("{name} must be a non-negative integer")))
        }
    }
}

pub(crate) fn flag(params: &Map<String, Value>, name: &str) -> Result<bool, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(RpcError::invalid(format!("{name} must be true or false"))),
    }
}

pub(crate) fn object<'a>(
    params: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a Map<String, Value>>, RpcError> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(RpcError::invalid(format!("{name} must be an object"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_or_answered_with_the_right_code() {
        let ok = Request::read(br#"{"jsonrpc":"2.0","id":"1","method":"GetTask","params":{"id":"x"}}"#).unwrap();
        assert_eq!((ok.id, ok.method.as_str()), (json!("1"), "GetTask"));
        assert_eq!(Request::read(b"{").unwrap_err().1.code, code::PARSE);
        assert_eq!(
            Request::read(br#"{"jsonrpc":"1.0","id":2,"method":"x"}"#).unwrap_err(),
            (json!(2), RpcError::new(code::INVALID_REQUEST, "jsonrpc must be \"2.0\""))
        );
        assert_eq!(
            Request::read(br#"{"jsonrpc":"2.0","id":3,"method":"x","params":[1]}"#).unwrap_err().1.code,
            code::INVALID_PARAMS
        );
    }

    #[test]
    fn gateway_codes_become_a2a_codes() {
        assert_eq!(RpcError::from(tonic::Status::not_found("no session")).code, code::TASK_NOT_FOUND);
        assert_eq!(RpcError::from(tonic::Status::invalid_argument("bad")).code, code::INVALID_PARAMS);
        let busy = RpcError::from(tonic::Status::resource_exhausted("slow down"));
        assert_eq!((busy.code, busy.data), (code::INTERNAL, Some(json!({"grpc_code": "ResourceExhausted"}))));
    }
}
