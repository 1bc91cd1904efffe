//! The call of a forced tool choice whose output did not finish a well-formed call (cut by the token
//! limit or a stop string, malformed DSML, a block closed with no call): made up from what parses —
//! the `invoke` name and the parameters completed before the damage — so the reply is still a call.
use crate::tool_choice::Forced;
use ds4_tokenizer::dsml::{parse_all, DsmlEvent};
use ds4_tokenizer::special::DSML;

/// At most this many cut points are tried (the block is the model's output: bounded, but cheap anyway).
const MAX_CUTS: usize = 64;

/// The first call of `head` once its invoke and block are closed.
fn closed_call(head: &str) -> Option<(String, String)> {
    let text = format!("{head}\n</{DSML}invoke>\n</{DSML}tool_calls>");
    let (events, _) = parse_all(&text, false);
    events.into_iter().find_map(|e| match e {
        DsmlEvent::ToolCallDone { name, arguments_json } => Some((name, arguments_json)),
        _ => None,
    })
}

/// The name and arguments that parse from a damaged block (`raw`: the block's text from its start,
/// the forced opening included): its parameters up to the last one that parses, else none (`{}`);
/// no name when not even the first `invoke` header is whole.
pub fn salvage(raw: &str) -> (Option<String>, String) {
    let param_close = format!("</{DSML}parameter>");
    let cuts: Vec<usize> = raw.match_indices(&param_close).map(|(i, _)| i + param_close.len()).collect();
    for &end in cuts.iter().rev().take(MAX_CUTS) {
        if let Some((name, args)) = closed_call(&raw[..end]) {
            return (Some(name), args);
        }
    }
    let header = format!("<{DSML}invoke name=\"");
    let name = raw.find(&header).and_then(|i| raw[i..].find("\">").map(|j| i + j + 2)).and_then(|end| closed_call(&raw[..end])).map(|c| c.0);
    (name, "{}".to_string())
}

/// The forced call for a damaged block: the named tool; under `required` the name the model wrote when
/// it is declared, else the first declared tool.
pub fn forced_call(forced: &Forced, raw: &str) -> (String, String) {
    let (name, args) = salvage(raw);
    let name = match (&forced.name, name) {
        (Some(n), _) => n.clone(),
        (None, Some(n)) if forced.tools.contains(&n) => n,
        _ => forced.tools.first().cloned().unwrap_or_default(),
    };
    (name, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_tokenizer::chat::dsml_call_opening;

    fn forced(name: Option<&str>) -> Forced {
        Forced { prefix: dsml_call_opening(name), name: name.map(str::to_string), tools: vec!["get_weather".into(), "search".into()] }
    }

    #[test]
    fn keeps_the_parameters_completed_before_the_cut() {
        let raw = format!(
            "{}<{DSML}parameter name=\"city\" string=\"true\">Paris</{DSML}parameter>\n<{DSML}parameter name=\"days\" string=\"false\">2</{DSML}parameter>\n<{DSML}parameter name=\"x\" string=\"false\">[1,",
            dsml_call_opening(Some("get_weather"))
        );
        assert_eq!(salvage(&raw), (Some("get_weather".into()), "{\"city\":\"Paris\",\"days\":2}".into()));
    }

    #[test]
    fn skips_a_parameter_that_is_not_json() {
        let raw = format!(
            "{}<{DSML}parameter name=\"city\" string=\"true\">Paris</{DSML}parameter>\n<{DSML}parameter name=\"days\" string=\"false\">two</{DSML}parameter>\n",
            dsml_call_opening(Some("get_weather"))
        );
        assert_eq!(salvage(&raw).1, "{\"city\":\"Paris\"}");
    }

    #[test]
    fn garbage_gives_the_forced_name_and_empty_arguments() {
        let raw = format!("{}zq3 <<>> random tokens", dsml_call_opening(Some("search")));
        assert_eq!(salvage(&raw), (Some("search".into()), "{}".into()));
        assert_eq!(forced_call(&forced(Some("search")), &raw), ("search".into(), "{}".into()));
    }

    #[test]
    fn required_uses_a_declared_name_or_the_first_tool() {
        let ok = format!("{}<{DSML}invoke name=\"search\">\n<{DSML}parameter", dsml_call_opening(None));
        assert_eq!(forced_call(&forced(None), &ok), ("search".into(), "{}".into()));
        let unknown = format!("{}<{DSML}invoke name=\"rm_rf\">\n", dsml_call_opening(None));
        assert_eq!(forced_call(&forced(None), &unknown).0, "get_weather");
        assert_eq!(forced_call(&forced(None), &dsml_call_opening(None)).0, "get_weather");
    }
}
