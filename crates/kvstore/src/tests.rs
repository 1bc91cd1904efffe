use crate::format::{self, FormatError, Reason, StateRef};
use crate::store::{KvStore, SaveOutcome};
use ds4_model::kv::{CompressorState, LayerKv, Rows};
use ds4_model::KvState;
use std::path::{Path, PathBuf};

const MODEL: [u8; 32] = [7; 32];
const VOCAB: usize = 50;
const SWA: usize = 8;
const HD: usize = 4;
const IDX: usize = 3;

/// An empty state laid out like a stage of three layers (ratios 0, 4, 16), the template loads fill.
fn template(ctx: usize) -> KvState {
    let layers = [0usize, 4, 16]
        .iter()
        .map(|&ratio| LayerKv {
            ratio,
            raw: vec![0.0; SWA * HD],
            comp: (ratio != 0).then(|| Rows::with_capacity(HD, ds4_model::kv::compressed_capacity(ctx, ratio))),
            comp_state: (ratio != 0).then(|| CompressorState::new(ratio, if ratio == 4 { 2 } else { 1 }, HD)),
            idx: (ratio == 4).then(|| Rows::with_capacity(IDX, ds4_model::kv::compressed_capacity(ctx, ratio))),
            idx_state: (ratio == 4).then(|| CompressorState::new(ratio, 2, IDX)),
        })
        .collect();
    KvState { pos: 0, ctx, first_layer: 2, layers, journal: None, slot: 0 }
}

/// A state as if `n` tokens had been consumed, with distinct values everywhere (seeded).
fn filled(n: usize, seed: u32) -> (Vec<u32>, KvState, Vec<f32>) {
    let mut kv = template(256);
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x % 10000) as f32 / 100.0 - 50.0
    };
    for l in &mut kv.layers {
        l.raw.iter_mut().for_each(|v| *v = next());
        if let Some(r) = &mut l.comp {
            for _ in 0..n / l.ratio {
                let row: Vec<f32> = (0..r.width).map(|_| next()).collect();
                r.push(&row);
            }
        }
        if let Some(r) = &mut l.idx {
            for _ in 0..n / l.ratio {
                let row: Vec<f32> = (0..r.width).map(|_| next()).collect();
                r.push(&row);
            }
        }
        for s in [&mut l.comp_state, &mut l.idx_state].into_iter().flatten() {
            s.kv.iter_mut().for_each(|v| *v = next());
            s.score.iter_mut().step_by(3).for_each(|v| *v = next());
        }
    }
    kv.pos = n;
    let tokens = (0..n as u32).map(|i| i.wrapping_mul(31).wrapping_add(seed) % 1000).collect();
    let logits = (0..VOCAB).map(|_| next()).collect();
    (tokens, kv, logits)
}

fn tool_map() -> Vec<(String, String)> {
    vec![("call_abc".into(), "<｜DSML｜tool_calls>\n<x/></｜DSML｜tool_calls>".into()), ("call_def".into(), String::new())]
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-kvstore-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn decode(bytes: &[u8], model: &[u8; 32]) -> Result<(format::Restored, KvState, Vec<f32>), FormatError> {
    let mut kv = template(256);
    let mut logits = Vec::new();
    let r = format::decode_from(&mut &bytes[..], bytes.len() as u64, model, &mut kv, &mut logits, Some(VOCAB))?;
    Ok((r, kv, logits))
}

#[test]
fn round_trip_is_exact() {
    for n in [0usize, 1, 5, 33, 100] {
        let (tokens, kv, logits) = filled(n, n as u32 + 3);
        let logits = if n == 0 { Vec::new() } else { logits };
        let map = tool_map();
        let bytes = format::encode(&MODEL, Reason::Cold, &StateRef { tokens: &tokens, kv: &kv, logits: &logits, tool_map: &map });
        let (r, kv2, logits2) = decode(&bytes, &MODEL).unwrap();
        assert_eq!(r.tokens, tokens);
        assert_eq!(r.reason, Reason::Cold);
        assert_eq!(r.tool_map, map);
        assert_eq!(kv2, kv, "n={n}");
        assert_eq!(logits2, logits);
        // NaN/-inf frontiers survive bit-exactly too.
        assert!(kv2.layers[1].comp_state.as_ref().unwrap().score.contains(&f32::NEG_INFINITY));
    }
}

#[test]
fn every_flipped_byte_and_every_truncation_is_detected() {
    let (tokens, kv, logits) = filled(20, 9);
    let map = tool_map();
    let bytes = format::encode(&MODEL, Reason::Evict, &StateRef { tokens: &tokens, kv: &kv, logits: &logits, tool_map: &map });
    // Every byte offset, two different flips.
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            assert!(decode(&b, &MODEL).is_err(), "flip {mask:#x} at {i} of {} went unnoticed", bytes.len());
        }
    }
    // Every truncation, and trailing garbage.
    for len in 0..bytes.len() {
        assert!(decode(&bytes[..len], &MODEL).is_err(), "truncation to {len} went unnoticed");
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 5]);
    assert!(decode(&longer, &MODEL).is_err());
    // Lies in the length field of an intact-looking read: the caller's length disagrees.
    let mut kv3 = template(256);
    let mut l3 = Vec::new();
    assert!(format::decode_from(&mut &bytes[..], bytes.len() as u64 + 1, &MODEL, &mut kv3, &mut l3, None).is_err());
}

#[test]
fn wrong_version_model_and_layout_are_refused() {
    let (tokens, kv, logits) = filled(12, 1);
    let st = StateRef { tokens: &tokens, kv: &kv, logits: &logits, tool_map: &[] };
    let bytes = format::encode(&MODEL, Reason::Cold, &st);
    assert!(matches!(decode(&bytes, &[8; 32]), Err(FormatError::OtherModel)));
    // A different version with a valid checksum (as a future build would write it).
    let mut v2 = bytes.clone();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    let mut h = sha2::Sha256::new();
    use sha2::Digest;
    h.update(&v2[..format::HEADER_LEN]);
    let tools_len = u64::from_le_bytes(v2[120..128].try_into().unwrap()) as usize;
    h.update(&v2[format::FRONT_LEN..format::FRONT_LEN + tokens.len() * 4 + tools_len]);
    let sum: [u8; 32] = h.finalize().into();
    v2[format::HEADER_LEN..format::FRONT_LEN].copy_from_slice(&sum);
    assert!(matches!(decode(&v2, &MODEL), Err(FormatError::Version(2))));
    // Another layer range / layout.
    let mut kv4 = template(256);
    kv4.first_layer = 3;
    assert!(matches!(format::decode_from(&mut &bytes[..], bytes.len() as u64, &MODEL, &mut kv4, &mut Vec::new(), None), Err(FormatError::Shape(_))));
    let mut kv5 = template(256);
    kv5.layers[0].raw = vec![0.0; 3];
    assert!(matches!(format::decode_from(&mut &bytes[..], bytes.len() as u64, &MODEL, &mut kv5, &mut Vec::new(), None), Err(FormatError::Shape(_))));
    // A context too small for the tokens.
    let mut kv6 = template(8);
    assert!(format::decode_from(&mut &bytes[..], bytes.len() as u64, &MODEL, &mut kv6, &mut Vec::new(), None).is_err());
    // Wrong vocabulary.
    assert!(format::decode_from(&mut &bytes[..], bytes.len() as u64, &MODEL, &mut template(256), &mut Vec::new(), Some(VOCAB + 1)).is_err());
    // Random garbage of many sizes never panics.
    let mut x = 12345u64;
    for len in [0usize, 1, 7, 8, 127, 128, 159, 160, 161, 500, 5000] {
        let g: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) as u8
            })
            .collect();
        assert!(decode(&g, &MODEL).is_err());
        let mut with_magic = g.clone();
        if with_magic.len() >= 8 {
            with_magic[..8].copy_from_slice(format::MAGIC);
            assert!(decode(&with_magic, &MODEL).is_err());
        }
    }
}

fn save(store: &mut KvStore, n: usize, seed: u32) -> (Vec<u32>, SaveOutcome) {
    let (tokens, kv, logits) = filled(n, seed);
    let out = store.save(&StateRef { tokens: &tokens, kv: &kv, logits: &logits, tool_map: &tool_map() }, Reason::Cold).unwrap();
    (tokens, out)
}

fn kv_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "kv")).collect();
    v.sort();
    v
}

fn dir_bytes(dir: &Path) -> u64 {
    kv_files(dir).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

#[test]
fn store_finds_longest_prefix_and_survives_reopen() {
    let dir = tmpdir("prefix");
    let mut s = KvStore::open(&dir, 1 << 30, MODEL).unwrap();
    let (t40, _) = save(&mut s, 40, 5);
    let (t10, kv10, l10) = filled(10, 5);
    assert_eq!(&t40[..10], &t10[..]);
    s.save(&StateRef { tokens: &t10, kv: &kv10, logits: &l10, tool_map: &[] }, Reason::Cold).unwrap();
    assert_eq!(save(&mut s, 10, 5).1, SaveOutcome::AlreadyStored);
    save(&mut s, 60, 77);
    assert_eq!(s.len(), 3);
    drop(s);

    let mut s = KvStore::open(&dir, 1 << 30, MODEL).unwrap();
    assert_eq!(s.len(), 3);
    // The tool map is part of the index, readable before any load.
    let e40 = s.entries().find(|e| e.tokens.len() == 40).unwrap();
    assert_eq!(*e40.tool_map, tool_map());
    let mut prompt = t40.clone();
    prompt.extend([1, 2, 3]);
    let e = s.lookup_longest_prefix(&prompt, 0).unwrap();
    assert_eq!(e.tokens.len(), 40);
    assert_eq!(s.lookup_longest_prefix(&t40[..30], 0).unwrap().tokens.len(), 10);
    assert!(s.lookup_longest_prefix(&t40, 40).is_none());
    assert!(s.lookup_longest_prefix(&[999, 1], 0).is_none());
    let mut kv = template(256);
    let mut logits = Vec::new();
    let r = s.load(&e, &mut kv, &mut logits, Some(VOCAB)).unwrap();
    let (_, kv40, l40) = filled(40, 5);
    assert_eq!(kv, kv40);
    assert_eq!(logits, l40);
    assert_eq!(r.tool_map, tool_map());
    assert_eq!(s.stats.hits, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_are_removed_at_open_and_at_load() {
    let dir = tmpdir("bad");
    let mut s = KvStore::open(&dir, 1 << 30, MODEL).unwrap();
    for i in 0..6 {
        save(&mut s, 20 + i, i as u32);
    }
    drop(s);
    let files = kv_files(&dir);
    assert_eq!(files.len(), 6);
    // 0: truncated inside the body; 1: body byte flipped; 2: header byte flipped; 3: other model;
    // 4: renamed to another key; 5: intact. Plus junk files and a stale temp file.
    let b = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &b[..b.len() - 9]).unwrap();
    let mut b = std::fs::read(&files[1]).unwrap();
    let n = b.len();
    b[n - 40] ^= 0x10;
    std::fs::write(&files[1], &b).unwrap();
    let mut b = std::fs::read(&files[2]).unwrap();
    b[70] ^= 1;
    std::fs::write(&files[2], &b).unwrap();
    let (t, kv, l) = filled(5, 99);
    std::fs::write(&files[3], format::encode(&[1; 32], Reason::Cold, &StateRef { tokens: &t, kv: &kv, logits: &l, tool_map: &[] })).unwrap();
    let other = dir.join(format!("{}.kv", "ab".repeat(32)));
    std::fs::rename(&files[4], &other).unwrap();
    std::fs::write(dir.join("zz.kv"), b"junk").unwrap();
    std::fs::write(dir.join("hits.idx"), b"garbage line\n\xff\xfe\n").unwrap();
    std::fs::write(dir.join(".x.kv.tmp1"), b"partial").unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(dir.join(".x.kv.tmp1")).unwrap().set_modified(old).unwrap();

    std::fs::write(dir.join("session.kv"), b"a --kv-save file").unwrap();

    let mut s = KvStore::open(&dir, 1 << 30, MODEL).unwrap();
    // Header-level damage is caught at open; the body flip only when loaded. Another model's file
    // and files not named as this cache names them are left alone.
    assert_eq!(s.len(), 2, "{:?}", kv_files(&dir));
    assert_eq!((s.stats.removed_bad, s.stats.foreign), (3, 1));
    assert!(!dir.join(".x.kv.tmp1").exists());
    assert!(dir.join("zz.kv").exists() && dir.join("session.kv").exists() && files[3].exists());
    let entries: Vec<_> = s.entries().cloned().collect();
    let mut ok = 0;
    for e in entries {
        let mut kv = template(256);
        let mut logits = Vec::new();
        if s.load(&e, &mut kv, &mut logits, Some(VOCAB)).is_ok() {
            ok += 1;
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(s.len(), 1);
    assert_eq!(kv_files(&dir).len(), 4, "the intact file, the other model's and the two foreign names");
    assert_eq!(s.stats.removed_bad, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eviction_keeps_the_budget_and_prefers_hit_files() {
    let dir = tmpdir("evict");
    let one = {
        let (t, kv, l) = filled(30, 0);
        format::encode(&MODEL, Reason::Cold, &StateRef { tokens: &t, kv: &kv, logits: &l, tool_map: &tool_map() }).len() as u64
    };
    let budget = one * 3 + one / 2;
    let mut s = KvStore::open(&dir, budget, MODEL).unwrap();
    let (hot, _) = save(&mut s, 30, 1);
    save(&mut s, 30, 2);
    save(&mut s, 30, 3);
    // Hit the first (oldest) file a few times: it must outlive newer, never-hit files.
    for _ in 0..3 {
        let e = s.lookup_longest_prefix(&hot, 0).unwrap();
        s.load(&e, &mut template(256), &mut Vec::new(), Some(VOCAB)).unwrap();
    }
    for seed in 4..12 {
        let (_, out) = save(&mut s, 30, seed);
        assert!(matches!(out, SaveOutcome::Stored { .. }));
        let on_disk = dir_bytes(&dir);
        assert!(on_disk <= budget, "{on_disk} > {budget}");
        assert_eq!(on_disk, s.total_bytes());
        assert!(s.lookup_longest_prefix(&hot, 0).is_some(), "the hit file was evicted at seed {seed}");
    }
    assert!(s.stats.evictions >= 8);
    assert_eq!(s.len(), 3);
    // A file larger than the whole budget is not written.
    let mut small = KvStore::open(&dir, one / 2, MODEL).unwrap();
    assert_eq!(kv_files(&dir).len(), 0, "reopening under a smaller budget trims the directory");
    assert!(matches!(save(&mut small, 30, 50).1, SaveOutcome::TooLarge { .. }));
    assert_eq!(kv_files(&dir).len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_unlinked_while_open_is_still_read_whole() {
    let dir = tmpdir("unlink");
    let p = dir.join("one.kv");
    let (t, kv, l) = filled(16, 4);
    format::save_file(&p, &MODEL, Reason::Manual, &StateRef { tokens: &t, kv: &kv, logits: &l, tool_map: &[] }).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    std::fs::remove_file(&p).unwrap();
    let mut kv2 = template(256);
    let mut l2 = Vec::new();
    format::decode_from(&mut std::io::BufReader::new(f), len, &MODEL, &mut kv2, &mut l2, Some(VOCAB)).unwrap();
    assert_eq!(kv2, kv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `save_file` renames its temporary file over the target: a FIFO or device there (`--kv-save /dev/null`,
/// which as root replaced /dev/null with a regular file) or a directory is refused and left as it was;
/// a regular file is replaced.
#[test]
fn save_never_replaces_what_is_not_a_regular_file() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tmpdir("save-target");
    let (tokens, kv, logits) = filled(5, 1);
    let st = StateRef { tokens: &tokens, kv: &kv, logits: &logits, tool_map: &[] };
    let fifo = dir.join("fifo.kv");
    if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        let e = format::save_file(&fifo, &MODEL, Reason::Manual, &st).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still there");
    }
    let sub = dir.join("sub.kv");
    std::fs::create_dir_all(&sub).unwrap();
    assert!(format::save_file(&sub, &MODEL, Reason::Manual, &st).unwrap_err().to_string().contains("not a regular file"));
    assert!(sub.is_dir());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), if fifo.exists() { 2 } else { 1 }, "no temporary file left");
    let f = dir.join("ok.kv");
    std::fs::write(&f, b"old").unwrap();
    format::save_file(&f, &MODEL, Reason::Manual, &st).unwrap();
    let mut kv2 = template(256);
    let mut l2 = Vec::new();
    assert_eq!(format::load_file(&f, &MODEL, &mut kv2, &mut l2, Some(VOCAB)).unwrap().tokens, tokens);
    std::fs::remove_dir_all(&dir).ok();
}
