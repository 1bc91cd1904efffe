//! `--test-script FILE` (test only): scripted replies so integration tests can drive tool calls and
//! other fixed outputs through a model with random weights. See `Args::test_script`.
use serde_json::Value;

pub struct Script {
    rules: Vec<(String, String)>,
}

impl Script {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--test-script {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("--test-script {}: {e}", path.display()))?;
        let arr = v.as_array().ok_or_else(|| format!("--test-script {}: expected a JSON array", path.display()))?;
        let mut rules = Vec::new();
        for r in arr {
            match (r.get("when").and_then(Value::as_str), r.get("output").and_then(Value::as_str)) {
                (Some(w), Some(o)) if !w.is_empty() => rules.push((w.to_string(), o.to_string())),
                _ => return Err(format!("--test-script {}: each entry needs non-empty string `when` and string `output`", path.display())),
            }
        }
        Ok(Self { rules })
    }

    /// The scripted output for a request whose last message text is `last`.
    pub fn find(&self, last: &str) -> Option<&str> {
        self.rules.iter().find(|(w, _)| last.contains(w.as_str())).map(|(_, o)| o.as_str())
    }
}
