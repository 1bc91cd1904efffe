//! The checkpoint's safetensors files, memory-mapped, with one name index over all of them.
use crate::ConvertError;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub(crate) struct Source {
    files: Vec<(PathBuf, Mmap)>,
    index: HashMap<String, Entry>,
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

fn is_int(d: Dtype) -> bool {
    matches!(d, Dtype::I64 | Dtype::I32)
}

impl Source {
    pub(crate) fn open(dir: &Path) -> Result<Self, ConvertError> {
        let io = |path: &Path, e| ConvertError::Io { path: path.to_path_buf(), source: e };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(ConvertError::NoSafetensors(dir.to_path_buf()));
        }
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (fi, path) in paths.into_iter().enumerate() {
            let f = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
            let len = f.metadata().map_err(|e| io(&path, e))?.len();
            if len < 8 {
                return Err(ConvertError::Safetensors { path, problem: format!("file is {len} bytes, too short for a header") });
            }
            // SAFETY: read-only mapping of a file we do not modify; a concurrent truncation by another
            // process is outside what a converter can defend against.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| io(&path, e))?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| ConvertError::Safetensors { path: path.clone(), problem: e.to_string() })?;
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                let (start, end) = (base.checked_add(a), base.checked_add(b));
                let (Some(start), Some(end)) = (start, end) else {
                    return Err(ConvertError::Safetensors { path: path.clone(), problem: format!("tensor `{name}`: offsets overflow") });
                };
                if start > end || end > map.len() {
                    return Err(ConvertError::Safetensors { path: path.clone(), problem: format!("tensor `{name}`: data outside the file") });
                }
                if index.contains_key(&name) {
                    return Err(ConvertError::DuplicateTensor { name });
                }
                index.insert(name, Entry { file: fi, dtype: info.dtype, shape: info.shape.clone(), start, end });
            }
            files.push((path, map));
        }
        Ok(Self { files, index })
    }

    pub(crate) fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.index.keys().cloned().collect();
        v.sort();
        v
    }

    fn entry(&self, name: &str, gguf: &str) -> Result<&Entry, ConvertError> {
        self.index.get(name).ok_or_else(|| ConvertError::MissingTensor { name: name.into(), gguf: gguf.into() })
    }

    /// Presence, shape and dtype of a tensor the plan needs.
    pub(crate) fn check(&self, name: &str, shape: &[usize], gguf: &str, int: bool) -> Result<(), ConvertError> {
        let e = self.entry(name, gguf)?;
        if e.shape != shape {
            return Err(ConvertError::Shape { name: name.into(), expected: shape.to_vec(), got: e.shape.clone() });
        }
        let ok = if int { is_int(e.dtype) } else { is_float(e.dtype) };
        if !ok {
            return Err(ConvertError::Dtype {
                name: name.into(),
                dtype: format!("{:?}", e.dtype),
                expected: if int { "I64 or I32" } else { "F32, F16 or BF16" },
            });
        }
        let n: usize = shape.iter().product();
        let need = n.checked_mul(e.dtype.bitsize() / 8);
        if need != Some(e.end - e.start) {
            return Err(ConvertError::Safetensors {
                path: self.files[e.file].0.clone(),
                problem: format!("tensor `{name}`: {} data bytes for shape {:?} {:?}", e.end - e.start, e.shape, e.dtype),
            });
        }
        Ok(())
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        &self.files[e.file].1[e.start..e.end]
    }

    /// Float tensor as f32 (checked by `check` first). Non-finite values are an error.
    pub(crate) fn f32s(&self, name: &str, gguf: &str) -> Result<Vec<f32>, ConvertError> {
        let e = self.entry(name, gguf)?;
        let b = self.bytes(e);
        let v: Vec<f32> = match e.dtype {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            d => return Err(ConvertError::Dtype { name: name.into(), dtype: format!("{d:?}"), expected: "F32, F16 or BF16" }),
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(ConvertError::Value { name: name.into(), index: i, value: v[i].to_string(), problem: "not finite".into() });
        }
        Ok(v)
    }

    /// Integer tensor as i64.
    pub(crate) fn i64s(&self, name: &str, gguf: &str) -> Result<Vec<i64>, ConvertError> {
        let e = self.entry(name, gguf)?;
        let b = self.bytes(e);
        Ok(match e.dtype {
            Dtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            Dtype::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            d => return Err(ConvertError::Dtype { name: name.into(), dtype: format!("{d:?}"), expected: "I64 or I32" }),
        })
    }
}
