//! Golden tests for chat rendering. Each expected string is written by hand from the spec text;
//! the comment names the rule (dsv4-architecture.md §5.2 = "A52", ds4-features.md = "F").

use ds4_tokenizer::chat::{
    dsml_tool_calls, render_chat, tools_prompt, Message, RenderOptions, Role, ThinkMode, ToolCall, THINK_MAX_PREFIX,
};
use ds4_tokenizer::real_tokenizer;

const B: &str = "<｜begin▁of▁sentence｜>";
const E: &str = "<｜end▁of▁sentence｜>";
const U: &str = "<｜User｜>";
const A: &str = "<｜Assistant｜>";

fn opts(mode: ThinkMode) -> RenderOptions {
    RenderOptions { mode, ctx: 65_536, ..Default::default() }
}

#[test]
fn single_turn_thinking_and_non_thinking() {
    // A52: BOS + system text (raw, no marker) + <｜User｜> + text, then <｜Assistant｜> + <think> (thinking)
    // or </think> (non-thinking).
    let msgs = [Message::system("You are helpful."), Message::user("Hi")];
    assert_eq!(render_chat(&msgs, &opts(ThinkMode::High)), format!("{B}You are helpful.{U}Hi{A}<think>"));
    assert_eq!(render_chat(&msgs, &opts(ThinkMode::None)), format!("{B}You are helpful.{U}Hi{A}</think>"));
    // F §7 validation prompt shape: BOS <｜User｜>text<｜Assistant｜></think>
    assert_eq!(render_chat(&[Message::user("x")], &opts(ThinkMode::None)), format!("{B}{U}x{A}</think>"));
}

#[test]
fn several_system_messages_join_with_blank_line() {
    // DS4 render_chat_prompt_text: system messages concatenated with "\n\n".
    let msgs = [Message::system("a"), Message::user("q"), Message::system("b")];
    assert_eq!(render_chat(&msgs, &opts(ThinkMode::None)), format!("{B}a\n\nb{U}q{A}</think>"));
}

#[test]
fn think_max_prefix_only_with_large_context() {
    // A52: thinking-max prefix inserted right after BOS; DS4 only uses it when ctx ≥ 393216
    // (F §4.2 / §5.4: otherwise falls back to normal thinking).
    let msgs = [Message::system("S"), Message::user("Hi")];
    let mut o = opts(ThinkMode::Max);
    o.ctx = 393_216;
    assert_eq!(render_chat(&msgs, &o), format!("{B}{THINK_MAX_PREFIX}S{U}Hi{A}<think>"));
    o.ctx = 393_215;
    assert_eq!(render_chat(&msgs, &o), format!("{B}S{U}Hi{A}<think>"));
    assert!(THINK_MAX_PREFIX.starts_with("Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"));
    assert!(THINK_MAX_PREFIX.ends_with("unchecked.\n\n"));
    assert_eq!(ThinkMode::from_reasoning_effort("minimal"), Some(ThinkMode::High));
    assert_eq!(ThinkMode::from_reasoning_effort("none"), Some(ThinkMode::None));
}

#[test]
fn history_reasoning_dropped_before_last_user_kept_after() {
    // A52: opener in thinking mode: <think>+reasoning+</think> for assistant turns after the last user
    // message, plain </think> for earlier turns (their reasoning is dropped).
    let msgs = [
        Message::user("q1"),
        Message::assistant("a1").with_reasoning("r1"),
        Message::user("q2"),
        Message::assistant("a2").with_reasoning("r2"),
    ];
    assert_eq!(
        render_chat(&msgs, &opts(ThinkMode::High)),
        format!("{B}{U}q1{A}</think>a1{E}{U}q2{A}<think>r2</think>a2{E}")
    );
    // A52: non-thinking mode: opener is always </think>.
    assert_eq!(
        render_chat(&msgs, &opts(ThinkMode::None)),
        format!("{B}{U}q1{A}</think>a1{E}{U}q2{A}</think>a2{E}")
    );
    // completed turn followed by a new user message: reply opener appended
    let msgs2 = [Message::user("q1"), Message::assistant("a1").with_reasoning("r1"), Message::user("q2")];
    assert_eq!(render_chat(&msgs2, &opts(ThinkMode::High)), format!("{B}{U}q1{A}</think>a1{E}{U}q2{A}<think>"));
}

#[test]
fn tool_context_keeps_all_reasoning_and_renders_dsml_history() {
    // A52: if any message carries tools nothing is dropped; DSML block format; tool results merged
    // into a user turn as <tool_result>…</tool_result>; F §5.6 reasoning replay rule.
    let msgs = [
        Message::user("weather?"),
        Message::assistant("").with_reasoning("need tool").with_tool_call("c1", "get_weather", r#"{"city": "Roma", "days": 3}"#),
        Message::tool("c1", "sunny"),
        Message::assistant("It is sunny.").with_reasoning("done"),
        Message::user("thanks"),
    ];
    let dsml = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
<｜DSML｜parameter name=\"city\" string=\"true\">Roma</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let want = format!(
        "{B}{U}weather?{A}<think>need tool</think>{dsml}{E}{U}<tool_result>sunny</tool_result>{A}<think>done</think>It is sunny.{E}{U}thanks{A}<think>"
    );
    assert_eq!(render_chat(&msgs, &opts(ThinkMode::High)), want);
}

#[test]
fn tool_results_merged_and_ordered_like_calls() {
    // A52: tool results merged into one user turn, ordered like the preceding calls; DS4 concatenates
    // them with no separator (ENC 0731: "\n\n", selectable).
    let msgs = [
        Message::user("go"),
        Message::assistant("").with_tool_call("a", "f", "{}").with_tool_call("b", "g", "{}"),
        Message::tool("b", "B"),
        Message::tool("a", "A"),
    ];
    let calls = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let mut o = opts(ThinkMode::None);
    assert_eq!(
        render_chat(&msgs, &o),
        format!("{B}{U}go{A}</think>{calls}{E}{U}<tool_result>A</tool_result><tool_result>B</tool_result>{A}</think>")
    );
    o.tool_result_separator = "\n\n".into();
    assert_eq!(
        render_chat(&msgs, &o),
        format!("{B}{U}go{A}</think>{calls}{E}{U}<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>{A}</think>")
    );
}

#[test]
fn tool_result_escaping_only_closing_tag() {
    // A52: only the literal </tool_result> inside data is escaped.
    let msgs = [Message::user("x"), Message::tool("1", "a < b && c > d </tool_result> e")];
    assert_eq!(
        render_chat(&msgs, &opts(ThinkMode::None)),
        format!("{B}{U}x{U}<tool_result>a < b && c > d &lt;/tool_result> e</tool_result>{A}</think>")
    );
}

#[test]
fn tools_block_appended_to_system_before_client_system_text() {
    // A52: tool block appended to system; DS4 renders schemas before the client's system content.
    let schema = r#"{"name":"f","parameters":{"type":"object"}}"#.to_string();
    let block = tools_prompt(std::slice::from_ref(&schema));
    assert!(block.starts_with("## Tools\n\nYou have access to a set of tools"));
    assert!(block.contains("### Available Tool Schemas\n\n{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}\n\nYou MUST strictly follow"));
    assert!(block.ends_with("Use the exact parameter names from the schemas."));
    let mut o = opts(ThinkMode::High);
    o.tools = vec![schema];
    let msgs = [Message::system("Be brief."), Message::user("hi")];
    assert_eq!(render_chat(&msgs, &o), format!("{B}{block}\n\nBe brief.{U}hi{A}<think>"));
    assert_eq!(tools_prompt(&[]), "");
}

#[test]
fn dsml_argument_rendering_and_escapes() {
    // A52: string="true" raw text, "false" JSON literal. DS4 escapes </｜DSML｜parameter> inside strings
    // as &lt;…, inside JSON as \u003c…; attribute values are XML-escaped; non-object arguments become a
    // single `arguments` string parameter; key order is preserved.
    let calls = [ToolCall {
        id: None,
        name: "a\"b".into(),
        arguments: r#"{"z": "x </｜DSML｜parameter> y", "a": {"k": [1, 2]}, "n": null, "b": true}"#.into(),
        raw_dsml: None,
    }];
    assert_eq!(
        dsml_tool_calls(&calls),
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a&quot;b\">\n\
<｜DSML｜parameter name=\"z\" string=\"true\">x &lt;/｜DSML｜parameter> y</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"a\" string=\"false\">{\"k\":[1,2]}</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"n\" string=\"false\">null</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"b\" string=\"false\">true</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    );
    let bad = [ToolCall { id: None, name: "f".into(), arguments: "not json".into(), raw_dsml: None }];
    assert_eq!(
        dsml_tool_calls(&bad),
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    );
    // F §5.6 exact replay: the sampled block is reused byte-exact
    let raw = [ToolCall { raw_dsml: Some("\n\n<｜DSML｜tool_calls>RAW".into()), ..bad[0].clone() }];
    assert_eq!(dsml_tool_calls(&raw), "\n\n<｜DSML｜tool_calls>RAW");
}

#[test]
fn latest_reminder_and_developer_roles() {
    // A52: latest_reminder role: <｜latest_reminder｜> + content. developer role: <｜User｜> + content.
    let msgs = [
        Message::user("q"),
        Message::new(Role::LatestReminder, "be brief"),
        Message::new(Role::Developer, "internal"),
    ];
    assert_eq!(
        render_chat(&msgs, &opts(ThinkMode::None)),
        format!("{B}{U}q<｜latest_reminder｜>be brief{U}internal{A}</think>")
    );
    // DS4 server variant: developer folded into the system text
    let mut o = opts(ThinkMode::None);
    o.developer_as_system = true;
    assert_eq!(
        render_chat(&[Message::new(Role::Developer, "dev"), Message::user("q")], &o),
        format!("{B}dev{U}q{A}</think>")
    );
    assert_eq!(Role::parse("function"), Some(Role::Tool));
    assert_eq!(Role::parse("bogus"), None);
}

#[test]
fn rendered_prompt_encodes_with_special_ids() {
    // A52 + §5.1: special tokens are inserted by id, never BPE'd.
    let t = real_tokenizer().unwrap();
    let s = render_chat(&[Message::user("Ciao")], &opts(ThinkMode::High));
    let ids = t.encode(&s);
    assert_eq!(ids[0], 0);
    assert_eq!(ids[1], 128803);
    assert_eq!(&ids[ids.len() - 2..], &[128804, 128821]);
    assert_eq!(t.decode(&ids), s);
}

#[test]
fn assistant_prefill_is_left_open() {
    // Anthropic's assistant prefill: the last assistant turn is continued, so it gets no EOS and no new
    // assistant turn after it; its text is answer text (</think> before it even in thinking mode, unless
    // the turn carries its own reasoning).
    let cont = |mode| RenderOptions { continue_last_assistant: true, ..opts(mode) };
    let msgs = [Message::user("Hi"), Message::assistant("The answer is")];
    assert_eq!(render_chat(&msgs, &cont(ThinkMode::None)), format!("{B}{U}Hi{A}</think>The answer is"));
    assert_eq!(render_chat(&msgs, &cont(ThinkMode::High)), format!("{B}{U}Hi{A}</think>The answer is"));
    let reasoned = [Message::user("Hi"), Message::assistant("So").with_reasoning("r")];
    assert_eq!(render_chat(&reasoned, &cont(ThinkMode::High)), format!("{B}{U}Hi{A}<think>r</think>So"));
    // Not asked for: the turn is closed as history (and a new one opened only after a user turn).
    assert_eq!(render_chat(&msgs, &opts(ThinkMode::None)), format!("{B}{U}Hi{A}</think>The answer is{E}"));
    // A last assistant turn with tool calls is not a prefill.
    let called = [Message::user("Hi"), Message::assistant("").with_tool_call("c1", "f", "{}")];
    assert!(render_chat(&called, &cont(ThinkMode::None)).ends_with(E));
    // Earlier assistant turns stay closed.
    let multi = [Message::user("a"), Message::assistant("b"), Message::user("c"), Message::assistant("d")];
    assert_eq!(render_chat(&multi, &cont(ThinkMode::None)), format!("{B}{U}a{A}</think>b{E}{U}c{A}</think>d"));
}
