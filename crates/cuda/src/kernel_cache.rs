//! The on-disk cache of compiled kernel modules: where it lives, what names an entry, and the entry
//! file itself (a checked header around the CUBIN). CUDA-free, so it is tested without a GPU or NVRTC.
//!
//! An entry is written to a temporary file and renamed into place, so a reader never sees half a
//! file from a concurrent writer; a file that is short, long, from another format or whose checksum
//! does not match (a crash mid-write on a file system without ordered renames, a disk error, an edit)
//! reads as absent, and the module is compiled again and the entry rewritten.
use std::path::{Path, PathBuf};

/// First bytes of an entry (format version in the last byte).
const MAGIC: &[u8; 8] = b"DS4KMOD1";
/// Magic, payload length, payload checksum.
const HEADER: usize = 8 + 8 + 8;
/// Largest entry read (a module's CUBIN is a few hundred KB): anything bigger is not ours.
const MAX_ENTRY: u64 = 64 << 20;

/// The cache directory: `$DS4_CUDA_CACHE` if set, else `$XDG_CACHE_HOME/dwarfstar`, else
/// `$HOME/.cache/dwarfstar`; None (no caching) when none of them is set. `env` reads a variable.
pub fn cache_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(d) = set("DS4_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("dwarfstar"));
    }
    set("HOME").map(|h| PathBuf::from(h).join(".cache").join("dwarfstar"))
}

/// 64-bit FNV-1a over `parts`, each preceded by its length (so ("ab", "c") and ("a", "bc") differ).
/// Stable across builds and platforms, unlike std's hasher; collisions only cost a wrong cache hit
/// between two sources, which the key's size makes negligible.
pub fn key(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |b: u8| h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    for p in parts {
        for b in (p.len() as u64).to_le_bytes() {
            eat(b);
        }
        for &b in *p {
            eat(b);
        }
    }
    h
}

/// File name of module `name` compiled for `arch` under key `k`.
pub fn entry_name(name: &str, arch: &str, k: u64) -> String { format!("{name}-{arch}-{k:016x}.cubin") }

/// The payload of the entry at `path`, or None when it is missing or not a complete, intact entry.
pub fn load(path: &Path) -> Option<Vec<u8>> {
    if std::fs::metadata(path).ok()?.len() > MAX_ENTRY {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let sum = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len || key(&[payload]) != sum {
        return None;
    }
    Some(payload.to_vec())
}

/// Writes `payload` as the entry at `path` (directory created as needed): a temporary file in the same
/// directory, renamed over `path`. Other entries of the same module and arch (older sources, options
/// or NVRTC versions) are removed, so the directory holds one entry per module and architecture.
pub fn store(path: &Path, payload: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("cache entry path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    let file = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| std::io::Error::other("cache entry name is not UTF-8"))?;
    let tmp = dir.join(format!(".{file}.{}.{:?}.tmp", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&key(&[payload]).to_le_bytes());
    bytes.extend_from_slice(payload);
    if let Err(err) = std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err);
    }
    // Stale entries share the name up to the key: "{name}-{arch}-".
    if let Some(prefix) = file.get(..file.len().saturating_sub(16 + ".cubin".len())) {
        for old in std::fs::read_dir(dir)?.flatten() {
            let n = old.file_name();
            let n = n.to_string_lossy();
            if n != file && n.starts_with(prefix) && n.ends_with(".cubin") && n.len() == file.len() {
                let _ = std::fs::remove_file(old.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ds4-kcache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn cache_dir_precedence() {
        let env = |vars: &'static [(&'static str, &'static str)]| move |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string());
        assert_eq!(cache_dir(env(&[("DS4_CUDA_CACHE", "/a"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])), Some(PathBuf::from("/a")));
        assert_eq!(cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])), Some(PathBuf::from("/x/dwarfstar")));
        assert_eq!(cache_dir(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])), Some(PathBuf::from("/h/.cache/dwarfstar")));
        assert_eq!(cache_dir(env(&[])), None);
    }

    #[test]
    fn key_separates_parts_and_inputs() {
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_ne!(key(&[b"src", b"sm_90a"]), key(&[b"src", b"sm_80"]));
        assert_eq!(key(&[b"src", b"sm_90a"]), key(&[b"src", b"sm_90a"]));
        // FNV-1a 64 of the empty input is its offset basis (the published constant).
        assert_eq!(key(&[]), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn round_trip_and_stale_entries_removed() {
        let d = tmpdir("rt");
        let old = d.join(entry_name("matvec", "sm_90a", 1));
        let other_arch = d.join(entry_name("matvec", "sm_80", 1));
        let other_mod = d.join(entry_name("hc", "sm_90a", 1));
        for p in [&old, &other_arch, &other_mod] {
            store(p, b"old").unwrap();
        }
        let p = d.join(entry_name("matvec", "sm_90a", 2));
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        store(&p, &payload).unwrap();
        assert_eq!(load(&p).as_deref(), Some(&payload[..]));
        assert!(!old.exists(), "older entry of the same module and arch is removed");
        assert!(other_arch.exists() && other_mod.exists());
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn damaged_entries_read_as_absent() {
        let d = tmpdir("bad");
        let p = d.join(entry_name("m", "sm_90a", 3));
        assert_eq!(load(&p), None, "missing");
        let payload = vec![0x5au8; 4096];
        store(&p, &payload).unwrap();
        let good = std::fs::read(&p).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("header only", good[..HEADER].to_vec()),
            ("truncated", good[..good.len() - 1].to_vec()),
            ("extended", [&good[..], b"x"].concat()),
            ("flipped payload byte", { let mut b = good.clone(); b[HEADER + 100] ^= 1; b }),
            ("wrong magic", { let mut b = good.clone(); b[0] = b'X'; b }),
            ("huge length", { let mut b = good.clone(); b[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); b }),
        ];
        // A file larger than any entry is not read at all.
        let big = std::fs::File::create(&p).unwrap();
        big.set_len(MAX_ENTRY + 1).unwrap();
        drop(big);
        assert_eq!(load(&p), None, "oversized");
        for (what, bytes) in cases {
            std::fs::write(&p, &bytes).unwrap();
            assert_eq!(load(&p), None, "{what}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
