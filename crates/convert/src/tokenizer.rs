//! Tokenizer metadata: from the checkpoint's tokenizer.json when present (byte-level BPE: `model.vocab`,
//! `model.merges`, `added_tokens`), otherwise placeholder tokens so that tiny test models load.
use crate::{ConvertError, HfConfig};
use ds4_gguf::{GgufWriter, MetaType, MetaValue};
use serde_json::Value;
use std::path::Path;

pub(crate) struct Tok {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub types: Vec<i32>,
    pub bos: u32,
    pub eos: u32,
    pub from_file: bool,
}

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const UNUSED: i32 = 5;

pub(crate) fn load(dir: &Path, c: &HfConfig) -> Result<Tok, ConvertError> {
    let n = c.vocab_size;
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Ok(Tok {
            tokens: (0..n).map(|i| format!("<tok_{i}>")).collect(),
            merges: Vec::new(),
            types: vec![NORMAL; n],
            bos: c.bos_token_id,
            eos: c.eos_token_id,
            from_file: false,
        });
    }
    let err = |m: String| ConvertError::Tokenizer(m);
    let text = std::fs::read_to_string(&path).map_err(|e| ConvertError::Io { path: path.clone(), source: e })?;
    let j: Value = serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
    let model = j.get("model").ok_or_else(|| err("no `model`".into()))?;
    if let Some(t) = model.get("type").and_then(|t| t.as_str()) {
        if t != "BPE" {
            return Err(err(format!("model.type is `{t}`, expected `BPE`")));
        }
    }
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![UNUSED; n];
    let mut put = |id: u64, s: &str, ty: i32| -> Result<(), ConvertError> {
        let i = usize::try_from(id).ok().filter(|&i| i < n).ok_or_else(|| err(format!("token `{s}` has id {id} >= vocab_size {n}")))?;
        tokens[i] = Some(s.to_string());
        types[i] = ty;
        Ok(())
    };
    let vocab = model.get("vocab").and_then(|v| v.as_object()).ok_or_else(|| err("no `model.vocab` object".into()))?;
    for (s, id) in vocab {
        put(id.as_u64().ok_or_else(|| err(format!("token `{s}`: id is not an integer")))?, s, NORMAL)?;
    }
    if let Some(added) = j.get("added_tokens").and_then(|a| a.as_array()) {
        for a in added {
            let id = a.get("id").and_then(|x| x.as_u64()).ok_or_else(|| err("added token without integer `id`".into()))?;
            let s = a.get("content").and_then(|x| x.as_str()).ok_or_else(|| err("added token without `content`".into()))?;
            let special = a.get("special").and_then(|x| x.as_bool()).unwrap_or(false);
            put(id, s, if special { CONTROL } else { NORMAL })?;
        }
    }
    let mut merges = Vec::new();
    if let Some(ms) = model.get("merges").and_then(|m| m.as_array()) {
        for m in ms {
            match m {
                Value::String(s) => merges.push(s.clone()),
                Value::Array(p) if p.len() == 2 && p.iter().all(|x| x.is_string()) => {
                    merges.push(format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()))
                }
                o => return Err(err(format!("merge entry {o} is neither \"a b\" nor [a, b]"))),
            }
        }
    }
    Ok(Tok {
        tokens: tokens.into_iter().enumerate().map(|(i, t)| t.unwrap_or_else(|| format!("<unused_{i}>"))).collect(),
        merges,
        types,
        bos: c.bos_token_id,
        eos: c.eos_token_id,
        from_file: true,
    })
}

pub(crate) fn write(w: &mut GgufWriter, t: &Tok) {
    let strs = |xs: &[String]| MetaValue::Array(MetaType::Str, xs.iter().map(|s| MetaValue::Str(s.clone())).collect());
    w.add_kv("tokenizer.ggml.model", MetaValue::Str("gpt2".into()));
    w.add_kv("tokenizer.ggml.pre", MetaValue::Str("joyai-llm".into()));
    w.add_kv("tokenizer.ggml.tokens", strs(&t.tokens));
    w.add_kv("tokenizer.ggml.merges", strs(&t.merges));
    w.add_kv("tokenizer.ggml.token_type", MetaValue::Array(MetaType::I32, t.types.iter().map(|&x| MetaValue::I32(x)).collect()));
    w.add_kv("tokenizer.ggml.bos_token_id", MetaValue::U32(t.bos));
    w.add_kv("tokenizer.ggml.eos_token_id", MetaValue::U32(t.eos));
}
