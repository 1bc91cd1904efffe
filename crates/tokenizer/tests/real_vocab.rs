//! The real V4 vocabulary against HF `tokenizers` (Python 0.23.3) ids on the fixture corpus
//! (tools/reference/tokenizer_fixtures.py -> tests/fixtures/hf_ids.jsonl.gz).

use std::io::{BufRead, BufReader};

use ds4_tokenizer::{real_tokenizer, real_vocab, special, tiny_tokenizer, tiny_vocab, StreamDecoder, Tokenizer};

struct Case {
    text: String,
    ids: Vec<u32>,
}

fn fixtures() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_ids.jsonl.gz");
    let f = std::fs::File::open(path).expect("fixture file");
    let r = BufReader::new(flate2::read::GzDecoder::new(f));
    let mut out = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let line = line.expect("fixture line");
        let v: serde_json::Value = serde_json::from_str(&line).expect("fixture json");
        if i == 0 {
            assert!(v.get("tokenizers_version").is_some(), "header line");
            continue;
        }
        let text = v["text"].as_str().expect("text").to_string();
        let ids = v["ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect();
        out.push(Case { text, ids });
    }
    out
}

fn real() -> &'static Tokenizer {
    real_tokenizer().expect("real tokenizer builds")
}

#[test]
fn real_vocab_shape_and_chat_ids() {
    let (tokens, merges, types) = real_vocab().unwrap();
    assert_eq!(tokens.len(), 129_280);
    assert_eq!(merges.len(), 127_741);
    assert_eq!(types.iter().filter(|&&t| t == special::TOKEN_TYPE_CONTROL || t == special::TOKEN_TYPE_USER_DEFINED).count(), 1283);
    let t = real();
    let c = t.chat_ids().unwrap();
    // ids from spec dsv4-architecture.md §5.1
    assert_eq!((c.bos, c.eos, c.user, c.assistant), (0, 1, 128803, 128804));
    assert_eq!((c.think_start, c.think_end, c.dsml, c.latest_reminder), (128821, 128822, 128825, Some(128828)));
    assert!(t.is_control(0) && t.is_control(1));
    assert!(t.is_added(128803) && !t.is_control(128803));
    assert!(!t.is_added(1000));
}

#[test]
fn hf_ids_identical_on_whole_corpus() {
    let t = real();
    let cases = fixtures();
    assert!(cases.len() >= 2000, "corpus has {} strings", cases.len());
    let mut bad = Vec::new();
    for c in &cases {
        let ids = t.encode(&c.text);
        if ids != c.ids {
            bad.push(c.text.clone());
        }
    }
    assert!(bad.is_empty(), "{} / {} mismatches, first: {:?}", bad.len(), cases.len(), bad.first());
}

#[test]
fn decode_roundtrip_and_streaming_equal_decode() {
    let t = real();
    for c in fixtures() {
        let dec = t.decode(&c.ids);
        assert_eq!(dec, c.text, "decode(encode(x)) == x");
        let mut sd = StreamDecoder::new();
        let mut s = String::new();
        for &id in &c.ids {
            let piece = sd.push(t, id);
            s.push_str(&piece);
        }
        s.push_str(&sd.finish());
        assert_eq!(s, dec, "stream concat == decode");
    }
}

#[test]
fn streaming_never_emits_broken_utf8_and_matches_lossy() {
    // Arbitrary id sequences, including partial UTF-8 byte tokens in odd orders.
    let t = real();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..300 {
        let mut ids = Vec::new();
        for _ in 0..20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // bias to byte tokens (ids 3..259 hold many single-byte tokens)
            let id = if x % 2 == 0 { (x >> 8) % 300 } else { (x >> 8) % 129_300 } as u32;
            ids.push(id);
        }
        let mut sd = StreamDecoder::new();
        let mut s = String::new();
        for &id in &ids {
            s.push_str(&sd.push(t, id)); // String: valid UTF-8 by type
            assert!(sd.pending().len() <= 3);
        }
        s.push_str(&sd.finish());
        assert_eq!(s, t.decode(&ids));
    }
}

#[test]
fn split_character_is_held_back() {
    let t = real();
    // "€" = E2 82 AC as three single-byte tokens
    let ids: Vec<u32> = [0xE2u8, 0x82, 0xAC]
        .iter()
        .map(|&b| t.token_id(&ds4_tokenizer::byte_level::BYTE_TO_CHAR[b as usize].to_string()).unwrap())
        .collect();
    let mut sd = StreamDecoder::new();
    assert_eq!(sd.push(t, ids[0]), "");
    assert_eq!(sd.push(t, ids[1]), "");
    assert_eq!(sd.push(t, ids[2]), "€");
    // incomplete at the end -> one U+FFFD, as lossy decode
    assert_eq!(sd.push(t, ids[0]), "");
    assert_eq!(sd.finish(), "\u{FFFD}");
    assert_eq!(t.decode(&ids[..1]), "\u{FFFD}");
}

#[test]
fn heuristic_without_token_types_selects_the_same_added_tokens() {
    let (tokens, merges, types) = real_vocab().unwrap();
    let typed = real();
    let untyped = Tokenizer::from_parts(tokens, merges, "joyai-llm").unwrap();
    for id in 0..types.len() as u32 {
        assert_eq!(untyped.is_added(id), typed.is_added(id), "id {id} {:?}", typed.token_str(id));
    }
    for c in fixtures().iter().step_by(7) {
        assert_eq!(untyped.encode(&c.text), c.ids);
    }
}

#[test]
fn unknown_ids_and_bad_parts_do_not_panic() {
    let t = real();
    assert_eq!(t.decode(&[u32::MAX, 129_280, 40]), t.decode(&[40]));
    assert_eq!(t.token_text(u32::MAX), "");
    assert!(t.token_str(200_000).is_none());
    assert!(Tokenizer::from_parts(vec![], vec![], "joyai-llm").is_err());
    assert!(Tokenizer::from_parts(vec!["a".into()], vec![], "llama3").is_err());
    assert!(Tokenizer::from_parts(vec!["a".into(), "b".into()], vec!["a b".into()], "joyai-llm").is_err());
    assert!(Tokenizer::from_parts(vec!["a".into(), "b".into()], vec!["ab".into()], "joyai-llm").is_err());
    assert!(Tokenizer::from_parts_typed(vec!["a".into()], vec![], Some(&[1, 1]), "joyai-llm").is_err());
}

#[test]
fn tiny_vocab_is_consistent() {
    let (tokens, merges, types) = tiny_vocab().unwrap();
    assert_eq!(tokens.len(), ds4_tokenizer::TINY_VOCAB_SIZE);
    assert_eq!(types.len(), tokens.len());
    assert!(!merges.is_empty());
    let t = tiny_tokenizer().unwrap();
    let c = t.chat_ids().unwrap();
    let n = tokens.len() as u32;
    for id in [c.bos, c.eos, c.user, c.assistant, c.think_start, c.think_end, c.dsml] {
        assert!(id < n);
        assert!(t.is_added(id));
    }
    assert_ne!(c.user, 128_803); // looked up, not the real id
    for case in fixtures().iter().step_by(3) {
        let ids = t.encode(&case.text);
        assert!(ids.iter().all(|&i| i < n));
        assert_eq!(t.decode(&ids), case.text);
    }
    let ids = t.encode("<｜User｜>hi<｜Assistant｜><think>");
    assert_eq!(ids[0], c.user);
    assert_eq!(*ids.last().unwrap(), c.think_start);
}
