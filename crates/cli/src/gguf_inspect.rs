//! `ds4-gguf inspect FILE`: header, metadata, tensor table and per-type totals of a GGUF file.
use anyhow::Context;
use ds4_gguf::{GgmlType, GgufFile, MetaValue};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// GGUF file to inspect.
    pub file: PathBuf,
    /// Array elements shown per metadata array (longer arrays are abbreviated).
    #[arg(long, default_value_t = 8)]
    pub max_items: usize,
    /// Characters shown per string value (longer strings are cut, with a note).
    #[arg(long, default_value_t = 120)]
    pub max_chars: usize,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let f = GgufFile::open(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    write_report(&f, &args.file.display().to_string(), args, &mut out)?;
    out.flush()?;
    Ok(())
}

const GIB: f64 = (1u64 << 30) as f64;

fn fmt_str(s: &str, max_chars: usize) -> String {
    let n = s.chars().count();
    if n <= max_chars {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(max_chars).collect();
        format!("{head:?}... ({n} chars)")
    }
}

fn fmt_value(v: &MetaValue, args: &InspectArgs) -> String {
    match v {
        MetaValue::Str(s) => fmt_str(s, args.max_chars),
        MetaValue::Array(_, items) => {
            let mut s = String::from("[");
            for (i, it) in items.iter().take(args.max_items).enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push_str(&fmt_value(it, args));
            }
            if items.len() > args.max_items {
                s.push_str(&format!(", ... ({} more)", items.len() - args.max_items));
            }
            s.push(']');
            s
        }
        other => other.to_string(),
    }
}

fn fmt_type(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(_, items) => format!("{}[{}]", v.type_name(), items.len()),
        _ => v.type_name(),
    }
}

/// Full report; separate from `run` so tests can capture it.
pub fn write_report(f: &GgufFile, name: &str, args: &InspectArgs, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "file:        {name}")?;
    writeln!(out, "size:        {} bytes ({:.3} GiB)", f.bytes().len(), f.bytes().len() as f64 / GIB)?;
    writeln!(out, "version:     {}", f.version())?;
    writeln!(out, "alignment:   {}", f.alignment())?;
    writeln!(out, "data offset: {} (0x{:x})", f.data_offset(), f.data_offset())?;
    writeln!(out)?;
    writeln!(out, "metadata: {} keys", f.metadata().len())?;
    let kw = f.metadata().iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let types: Vec<String> = f.metadata().iter().map(|(_, v)| fmt_type(v)).collect();
    let tw = types.iter().map(|t| t.len()).max().unwrap_or(0);
    for ((k, v), t) in f.metadata().iter().zip(&types) {
        writeln!(out, "  {k:kw$}  {t:tw$}  {}", fmt_value(v, args))?;
    }
    writeln!(out)?;
    writeln!(out, "tensors: {} (offsets relative to the data section)", f.tensors().len())?;
    let shapes: Vec<String> = f
        .tensors()
        .iter()
        .map(|t| format!("[{}]", t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")))
        .collect();
    let nw = f.tensors().iter().map(|t| t.name.len()).max().unwrap_or(0).max(4);
    let sw = shapes.iter().map(|s| s.len()).max().unwrap_or(0).max(5);
    writeln!(out, "  {:nw$}  {:7}  {:sw$}  {:>14}  {:>14}", "name", "type", "shape", "offset", "bytes")?;
    let mut per_type: BTreeMap<u32, (GgmlType, u64, u64)> = BTreeMap::new();
    for (t, s) in f.tensors().iter().zip(&shapes) {
        writeln!(out, "  {:nw$}  {:7}  {s:sw$}  {:>14}  {:>14}", t.name, t.ty.name(), t.offset, t.n_bytes)?;
        let e = per_type.entry(t.ty as u32).or_insert((t.ty, 0, 0));
        e.1 += 1;
        e.2 += t.n_bytes;
    }
    writeln!(out)?;
    writeln!(out, "totals by type:")?;
    writeln!(out, "  {:7}  {:>6}  {:>16}  {:>10}", "type", "count", "bytes", "GiB")?;
    let (mut n, mut b) = (0u64, 0u64);
    for (ty, count, bytes) in per_type.values() {
        writeln!(out, "  {:7}  {count:>6}  {bytes:>16}  {:>10.3}", ty.name(), *bytes as f64 / GIB)?;
        n += count;
        b += bytes;
    }
    writeln!(out, "  {:7}  {n:>6}  {b:>16}  {:>10.3}", "total", b as f64 / GIB)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_gguf::{GgufWriter, MetaType};

    #[test]
    fn report_lists_everything_and_abbreviates() {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", MetaValue::Str("deepseek4".into()));
        w.add_kv("tok", MetaValue::Array(MetaType::Str, (0..1000).map(|i| MetaValue::Str(format!("t{i}"))).collect()));
        w.add_kv("long", MetaValue::Str("x".repeat(500)));
        w.add_tensor_info("a.weight", GgmlType::Q8_0, &[64, 2]).unwrap();
        w.add_tensor_info("b.weight", GgmlType::F32, &[3]).unwrap();
        w.add_tensor_info("c.weight", GgmlType::Q8_0, &[32]).unwrap();
        let bytes = w.to_bytes(&[&[1u8; 136], &[2u8; 12], &[3u8; 34]]).unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap();
        let args = InspectArgs { file: PathBuf::from("x.gguf"), max_items: 3, max_chars: 10 };
        let mut out = Vec::new();
        write_report(&f, "x.gguf", &args, &mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("version:     3"), "{s}");
        assert!(s.contains("alignment:   32"), "{s}");
        assert!(s.contains(&format!("data offset: {}", f.data_offset())), "{s}");
        assert!(s.contains("array<str>[1000]"), "{s}");
        assert!(s.contains("[\"t0\", \"t1\", \"t2\", ... (997 more)]"), "{s}");
        assert!(s.contains("\"xxxxxxxxxx\"... (500 chars)"), "{s}");
        assert!(s.contains("a.weight  Q8_0"), "{s}");
        assert!(s.contains("[64, 2]"), "{s}");
        let q8 = s.lines().find(|l| l.trim_start().starts_with("Q8_0")).unwrap();
        assert_eq!(q8.split_whitespace().collect::<Vec<_>>()[..3], ["Q8_0", "2", "170"]);
        let total = s.lines().find(|l| l.trim_start().starts_with("total ")).unwrap();
        assert_eq!(total.split_whitespace().collect::<Vec<_>>()[..3], ["total", "3", "182"]);
    }
}
