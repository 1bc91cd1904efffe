use ds4_tokenizer::chat::{dsml_tool_calls, ToolCall};
use ds4_tokenizer::dsml::{parse_all, DsmlEvent as Ev, DsmlParser};
use ds4_tokenizer::{real_tokenizer, StreamDecoder};

/// Merge adjacent Text / Reasoning events (streaming may split them anywhere).
fn coalesce(ev: Vec<Ev>) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::new();
    for e in ev {
        match (out.last_mut(), &e) {
            (Some(Ev::Text(a)), Ev::Text(b)) => a.push_str(b),
            (Some(Ev::Reasoning(a)), Ev::Reasoning(b)) => a.push_str(b),
            _ => out.push(e),
        }
    }
    out
}

fn feed(pieces: &[&str], thinking: bool) -> (Vec<Ev>, bool) {
    let mut p = DsmlParser::new(thinking);
    let mut ev = Vec::new();
    for s in pieces {
        ev.extend(p.push(s));
    }
    ev.extend(p.finish());
    (coalesce(ev), p.had_malformed())
}

const BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
<｜DSML｜parameter name=\"city\" string=\"true\">Roma &lt;/｜DSML｜parameter> x</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"opts\" string=\"false\">{\"days\": 3, \"units\": [\"C\"], \"s\": \"a>b\"}</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n<｜DSML｜invoke name=\"noop\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn expected_full() -> Vec<Ev> {
    vec![
        Ev::Reasoning("I should call the tool.".into()),
        Ev::Text("Let me check.".into()),
        Ev::ToolCallStart { name: "get_weather".into() },
        Ev::ToolCallDone {
            name: "get_weather".into(),
            arguments_json: r#"{"city":"Roma </｜DSML｜parameter> x","opts":{"days":3,"units":["C"],"s":"a>b"}}"#.into(),
        },
        Ev::ToolCallStart { name: "noop".into() },
        Ev::ToolCallDone { name: "noop".into(), arguments_json: "{}".into() },
    ]
}

fn full_text() -> String {
    format!("I should call the tool.</think>Let me check.{BLOCK}")
}

#[test]
fn whole_block_in_one_piece() {
    let (ev, bad) = parse_all(&full_text(), true);
    assert!(!bad);
    assert_eq!(coalesce(ev), expected_full());
}

#[test]
fn every_split_point_of_a_full_block() {
    let text = full_text();
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    for &i in &bounds {
        let (ev, bad) = feed(&[&text[..i], &text[i..]], true);
        assert!(!bad, "split at {i}");
        assert_eq!(ev, expected_full(), "split at {i}");
    }
    // three pieces, a sample of pairs of split points
    for (n, &i) in bounds.iter().enumerate().step_by(7) {
        for &j in bounds[n..].iter().step_by(11) {
            let (ev, _) = feed(&[&text[..i], &text[i..j], &text[j..]], true);
            assert_eq!(ev, expected_full(), "split at {i},{j}");
        }
    }
}

#[test]
fn char_by_char_and_real_token_pieces() {
    let text = full_text();
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(feed(&pieces, true).0, expected_full());

    let t = real_tokenizer().unwrap();
    let ids = t.encode(&text);
    let mut sd = StreamDecoder::new();
    let toks: Vec<String> = ids.iter().map(|&id| sd.push(t, id)).collect();
    let pieces: Vec<&str> = toks.iter().map(String::as_str).collect();
    assert_eq!(feed(&pieces, true).0, expected_full());
}

#[test]
fn non_thinking_and_plain_text() {
    let (ev, bad) = parse_all("Hello\n\nworld <think> </think> <｜DSML｜ x", false);
    assert!(!bad);
    assert_eq!(coalesce(ev), vec![Ev::Text("Hello\n\nworld <think> </think> <｜DSML｜ x".into())]);
    // reasoning only, never closed
    let (ev, _) = parse_all("thinking forever </thi", true);
    assert_eq!(coalesce(ev), vec![Ev::Reasoning("thinking forever </thi".into())]);
}

#[test]
fn string_false_literals_and_invalid_json() {
    let ok = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
<｜DSML｜parameter name=\"n\" string=\"false\">42</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"b\" string=\"false\">true</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"z\" string=\"false\">null</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"s\" string=\"true\">42</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let (ev, bad) = parse_all(ok, false);
    assert!(!bad);
    assert_eq!(
        ev.last().unwrap(),
        &Ev::ToolCallDone { name: "f".into(), arguments_json: r#"{"n":42,"b":true,"z":null,"s":"42"}"#.into() }
    );
    let badjson = "ok<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\
<｜DSML｜parameter name=\"n\" string=\"false\">{oops</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>after";
    let (ev, bad) = parse_all(badjson, false);
    assert!(bad);
    let ev = coalesce(ev);
    assert_eq!(ev[0], Ev::Text("ok".into()));
    assert_eq!(ev[1], Ev::ToolCallStart { name: "f".into() });
    match &ev[2] {
        Ev::Malformed { raw, reason } => {
            assert!(raw.starts_with("<｜DSML｜tool_calls>") && raw.ends_with("after"), "{raw}");
            assert!(reason.contains("invalid JSON"));
        }
        e => panic!("expected Malformed, got {e:?}"),
    }
}

#[test]
fn truncated_and_malformed_blocks() {
    let text = full_text();
    // truncation at every point inside the block -> Malformed with the raw block text
    let start = text.find("\n\n<｜DSML｜tool_calls>").unwrap();
    let first_marker_end = start + "\n\n<｜DSML｜tool_calls>".len();
    let end = text.len();
    for (i, _) in text.char_indices().filter(|&(i, _)| i > first_marker_end && i < end) {
        let (ev, bad) = feed(&[&text[..i]], true);
        assert!(bad, "truncated at {i}");
        match ev.last().unwrap() {
            Ev::Malformed { raw, reason } => {
                assert_eq!(raw, &text[start..i]);
                assert!(reason.contains("truncated"));
            }
            e => panic!("at {i}: {e:?}"),
        }
    }
    // wrong syntax inside a block
    let (ev, bad) = parse_all("<｜DSML｜tool_calls>\n<｜DSML｜bogus>x</｜DSML｜tool_calls> tail", false);
    assert!(bad);
    assert!(matches!(&ev[0], Ev::Malformed { raw, .. } if raw.ends_with("tail")));
    let (_, bad) = parse_all(
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"maybe\">v</｜DSML｜parameter>",
        false,
    );
    assert!(bad);
}

#[test]
fn parser_recovers_after_malformed_block() {
    let text = format!("<｜DSML｜tool_calls>\n<｜DSML｜nope>\nthen{BLOCK}");
    let (ev, bad) = parse_all(&text, false);
    assert!(bad);
    // the malformed block swallows the rest of the current buffer; streamed later text is parsed again
    let mut p = DsmlParser::new(false);
    let mut ev2 = p.push("<｜DSML｜tool_calls>\n<｜DSML｜nope>\n");
    ev2.extend(p.push(BLOCK));
    ev2.extend(p.finish());
    assert!(matches!(ev[0], Ev::Malformed { .. }));
    assert!(ev2.iter().any(|e| matches!(e, Ev::ToolCallDone { name, .. } if name == "noop")));
    assert_eq!(p.tool_calls(), 2);
}

#[test]
fn syntax_positions_for_greedy_sampling() {
    let mut p = DsmlParser::new(true);
    assert!(!p.in_syntax());
    p.push("r</think>visible");
    assert!(!p.in_syntax());
    p.push("<｜DSML｜tool_calls>\n");
    assert!(p.in_syntax() && p.in_tool_block());
    p.push("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">");
    assert!(!p.in_syntax(), "string payload uses request sampling");
    p.push("hello</｜DSML｜parameter>\n");
    assert!(p.in_syntax());
    p.push("<｜DSML｜parameter name=\"b\" string=\"false\">{\"k\": ");
    assert!(p.in_syntax(), "JSON punctuation is syntax");
    p.push("\"str");
    assert!(!p.in_syntax(), "JSON string value is payload");
    p.push("\\\" still\"");
    assert!(p.in_syntax());
    p.push("}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
    assert!(!p.in_syntax() && !p.in_tool_block());
}

#[test]
fn rendered_history_parses_back() {
    let calls = [
        ToolCall { id: None, name: "x<y".into(), arguments: r#"{"p": "a\nb </｜DSML｜parameter>", "q": [1, {"r": null}]}"#.into(), raw_dsml: None },
        ToolCall { id: None, name: "g".into(), arguments: "{}".into(), raw_dsml: None },
    ];
    let text = dsml_tool_calls(&calls);
    let (ev, bad) = parse_all(&text, false);
    assert!(!bad);
    let done: Vec<(String, serde_json::Value)> = ev
        .into_iter()
        .filter_map(|e| match e {
            Ev::ToolCallDone { name, arguments_json } => Some((name, serde_json::from_str(&arguments_json).unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0].0, "x<y");
    assert_eq!(done[0].1, serde_json::json!({"p": "a\nb </｜DSML｜parameter>", "q": [1, {"r": null}]}));
    assert_eq!(done[1].1, serde_json::json!({}));
}

#[test]
fn arbitrary_input_never_panics() {
    let alphabet = ["<", "｜", "DSML", "｜DSML｜", "tool_calls>", "</", "invoke name=\"", "\">", "parameter name=\"",
        "\" string=\"false\">", "\" string=\"true\">", "{", "\"", "\\", "\n", "</think>", "x", "é", "&lt;"];
    let mut s: u64 = 12345;
    for _ in 0..3000 {
        let mut p = DsmlParser::new(s % 2 == 0);
        for _ in 0..30 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let _ = p.push(alphabet[(s % alphabet.len() as u64) as usize]);
            let _ = p.in_syntax();
        }
        let _ = p.finish();
    }
}

#[test]
fn a_forced_call_opening_is_the_start_of_the_canonical_block() {
    use ds4_tokenizer::chat::{dsml_call_opening, dsml_tool_calls, ToolCall};
    let call = ToolCall { id: None, name: "a\"b".into(), arguments: "{\"x\": 1}".into(), raw_dsml: None };
    let block = dsml_tool_calls(&[call]);
    assert!(block.starts_with(&dsml_call_opening(Some("a\"b"))), "{block}");
    assert!(dsml_call_opening(Some("a\"b")).starts_with(&dsml_call_opening(None)));
}
