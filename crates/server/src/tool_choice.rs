//! `tool_choice` of each API: whether the model may, must, or must not call a tool, and which one.
//!
//! A forced choice (OpenAI `"required"` / a named function, Anthropic `any` / `tool`) is served by
//! starting the assistant turn with the DSML opening of a tool-call block (through the `invoke` header
//! for a named tool): the conversation gets an assistant prefill ([`prefill_call`]) that `chat_prompt`
//! continues, and the worker parses the output as if that opening had been generated
//! ([`Forced`], see `worker::Output`).
use crate::errors::ApiError;
use ds4_tokenizer::chat::{dsml_call_opening, ends_in_prefill, Message};
use serde_json::Value;

/// What a request's `tool_choice` allows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (also when `tool_choice` is absent or null).
    #[default]
    Auto,
    /// No tools: their schemas are left out of the prompt.
    None,
    /// At least one call, to any declared tool.
    Required,
    /// A call to this tool.
    Named(String),
}

/// A forced tool call as the worker needs it: the DSML already in the prompt, the forced name, the
/// declared names (for a call that must be made up from damaged output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forced {
    pub prefix: String,
    pub name: Option<String>,
    pub tools: Vec<String>,
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg).param("tool_choice")
}

fn name_of(o: &serde_json::Map<String, Value>, what: &str) -> Result<String, ApiError> {
    match o.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(invalid(format!("`tool_choice`: {what} needs a non-empty string `name`"))),
    }
}

/// The string forms shared by OpenAI chat and Responses.
fn openai_string(s: &str) -> Result<ToolChoice, ApiError> {
    match s {
        "auto" => Ok(ToolChoice::Auto),
        "none" => Ok(ToolChoice::None),
        "required" => Ok(ToolChoice::Required),
        _ => Err(invalid(format!("`tool_choice` must be \"none\", \"auto\", \"required\" or a function object, not \"{s}\""))),
    }
}

impl ToolChoice {
    fn absent(v: Option<&Value>) -> bool {
        v.is_none_or(Value::is_null)
    }

    /// OpenAI chat: `"none" | "auto" | "required" | {"type":"function","function":{"name"}}`.
    pub fn openai_chat(v: Option<&Value>) -> Result<Self, ApiError> {
        if Self::absent(v) {
            return Ok(Self::Auto);
        }
        match v {
            Some(Value::String(s)) => openai_string(s),
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let f = o.get("function").and_then(Value::as_object).ok_or_else(|| invalid("`tool_choice`: {\"type\":\"function\"} needs `function: {\"name\": ...}`"))?;
                Ok(Self::Named(name_of(f, "function")?))
            }
            _ => Err(invalid("`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":...}}")),
        }
    }

    /// Responses: `"none" | "auto" | "required" | {"type":"function","name"}`.
    pub fn responses(v: Option<&Value>) -> Result<Self, ApiError> {
        if Self::absent(v) {
            return Ok(Self::Auto);
        }
        match v {
            Some(Value::String(s)) => openai_string(s),
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => Ok(Self::Named(name_of(o, "function")?)),
            _ => Err(invalid("`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"name\":...} (hosted tools are not served)")),
        }
    }

    /// Anthropic: `{"type":"auto"|"any"|"none"} | {"type":"tool","name"}`, each with an optional
    /// `disable_parallel_tool_use`; returns the choice and whether only one call is allowed.
    pub fn anthropic(v: Option<&Value>) -> Result<(Self, bool), ApiError> {
        if Self::absent(v) {
            return Ok((Self::Auto, false));
        }
        let o = v.and_then(Value::as_object).ok_or_else(|| invalid("`tool_choice` must be an object: {\"type\":\"auto\"|\"any\"|\"tool\"|\"none\"}"))?;
        let single = match o.get("disable_parallel_tool_use") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("`tool_choice.disable_parallel_tool_use` must be a boolean")),
        };
        let choice = match o.get("type").and_then(Value::as_str) {
            Some("auto") => Self::Auto,
            Some("none") => Self::None,
            Some("any") => Self::Required,
            Some("tool") => Self::Named(name_of(o, "{\"type\":\"tool\"}")?),
            _ => return Err(invalid("`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\"")),
        };
        Ok((choice, single))
    }

    /// Whether the tool schemas go into the prompt.
    pub fn allows_tools(&self) -> bool {
        *self != Self::None
    }

    /// Checks a forced choice against the declared tool names (`tools`' schema lines) and returns what
    /// the worker needs to force it; None for auto/none.
    pub fn forced(&self, schemas: &[String]) -> Result<Option<Forced>, ApiError> {
        let names = schema_names(schemas);
        let name = match self {
            Self::Auto | Self::None => return Ok(None),
            Self::Required if names.is_empty() => return Err(invalid("`tool_choice` requires a tool call but `tools` declares no function")),
            Self::Required => None,
            Self::Named(n) if !names.contains(n) => {
                return Err(invalid(format!("`tool_choice` names the tool `{n}`, which is not in `tools`")));
            }
            Self::Named(n) => Some(n.clone()),
        };
        Ok(Some(Forced { prefix: dsml_call_opening(name.as_deref()), name, tools: names }))
    }
}

/// Tool names of the prompt's schema lines (`tools::*_tool_schemas`).
fn schema_names(schemas: &[String]) -> Vec<String> {
    schemas
        .iter()
        .filter_map(|s| serde_json::from_str::<Value>(s).ok())
        .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Starts the reply with the forced call's DSML as an assistant prefill: appended to the client's own
/// prefill when the conversation is continued, else a new assistant message with an empty reasoning
/// (so a thinking-mode prompt holds the same empty thinking block as the history that replays this
/// turn, and its KV prefix is reused). Returns `continue_last` for `chat_prompt` (always true).
pub fn prefill_call(messages: &mut Vec<Message>, forced: &Forced, continue_last: bool) -> bool {
    match messages.last_mut() {
        Some(m) if continue_last && ends_in_prefill(std::slice::from_ref(m)) => m.content.push_str(&forced.prefix),
        _ => messages.push(Message::assistant(forced.prefix.clone()).with_reasoning("")),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> Vec<String> {
        vec![json!({"name": "get_weather"}).to_string(), json!({"name": "search"}).to_string()]
    }

    #[test]
    fn openai_chat_forms() {
        assert_eq!(ToolChoice::openai_chat(None).unwrap(), ToolChoice::Auto);
        assert_eq!(ToolChoice::openai_chat(Some(&Value::Null)).unwrap(), ToolChoice::Auto);
        assert_eq!(ToolChoice::openai_chat(Some(&json!("none"))).unwrap(), ToolChoice::None);
        assert_eq!(ToolChoice::openai_chat(Some(&json!("required"))).unwrap(), ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "search"}});
        assert_eq!(ToolChoice::openai_chat(Some(&named)).unwrap(), ToolChoice::Named("search".into()));
        for bad in [json!("sometimes"), json!(1), json!({}), json!({"type": "function"}), json!({"type": "function", "function": {"name": ""}})] {
            let e = ToolChoice::openai_chat(Some(&bad)).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{bad}");
        }
    }

    #[test]
    fn responses_forms() {
        let named = json!({"type": "function", "name": "search"});
        assert_eq!(ToolChoice::responses(Some(&named)).unwrap(), ToolChoice::Named("search".into()));
        assert_eq!(ToolChoice::responses(Some(&json!("required"))).unwrap(), ToolChoice::Required);
        assert!(ToolChoice::responses(Some(&json!({"type": "file_search"}))).is_err());
    }

    #[test]
    fn anthropic_forms() {
        assert_eq!(ToolChoice::anthropic(Some(&json!({"type": "any"}))).unwrap(), (ToolChoice::Required, false));
        let t = json!({"type": "tool", "name": "search", "disable_parallel_tool_use": true});
        assert_eq!(ToolChoice::anthropic(Some(&t)).unwrap(), (ToolChoice::Named("search".into()), true));
        assert_eq!(ToolChoice::anthropic(Some(&json!({"type": "none"}))).unwrap().0, ToolChoice::None);
        assert!(ToolChoice::anthropic(Some(&json!({"type": "tool"}))).is_err());
        assert!(ToolChoice::anthropic(Some(&json!("any"))).is_err());
        assert!(ToolChoice::anthropic(Some(&json!({"type": "any", "disable_parallel_tool_use": "yes"}))).is_err());
    }

    #[test]
    fn forced_needs_a_declared_tool() {
        assert_eq!(ToolChoice::Auto.forced(&schemas()).unwrap(), None);
        let e = ToolChoice::Named("nope".into()).forced(&schemas()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("nope"));
        assert!(ToolChoice::Required.forced(&[]).is_err());
        let f = ToolChoice::Named("search".into()).forced(&schemas()).unwrap().unwrap();
        assert!(f.prefix.ends_with("invoke name=\"search\">\n"), "{}", f.prefix);
        assert_eq!(f.tools, vec!["get_weather", "search"]);
        let r = ToolChoice::Required.forced(&schemas()).unwrap().unwrap();
        assert!(r.prefix.ends_with("tool_calls>\n") && r.name.is_none());
    }

    #[test]
    fn prefill_opens_or_extends_the_assistant_turn() {
        let f = ToolChoice::Required.forced(&schemas()).unwrap().unwrap();
        let mut m = vec![Message::user("hi")];
        assert!(prefill_call(&mut m, &f, false));
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].content, f.prefix);
        assert_eq!(m[1].reasoning.as_deref(), Some(""));
        let mut p = vec![Message::user("hi"), Message::assistant("Sure.")];
        prefill_call(&mut p, &f, true);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].content, format!("Sure.{}", f.prefix));
    }
}
