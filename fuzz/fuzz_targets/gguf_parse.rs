#![no_main]
//! Parse arbitrary bytes as GGUF; when accepted, touch every tensor's data and every typed accessor.
use ds4_gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let mut acc = 0u64;
    for t in f.tensors() {
        let d = f.tensor_data(t);
        assert_eq!(d.len() as u64, t.n_bytes);
        assert!(f.data_offset() + t.offset + t.n_bytes <= f.bytes().len() as u64);
        acc = acc.wrapping_add(d.iter().map(|&b| b as u64).sum::<u64>());
        assert_eq!(f.tensor(&t.name).map(|x| x.offset), Some(t.offset));
    }
    for (k, v) in f.metadata() {
        let _ = f.get_u32(k);
        let _ = f.get_u64(k);
        let _ = f.get_f32(k);
        let _ = f.get_bool(k);
        let _ = f.get_str(k);
        let _ = f.get_u32_array(k);
        let _ = f.get_f32_array(k);
        let _ = f.get_str_array(k);
        let _ = v.display_abbrev(4).to_string();
        let _ = v.type_name();
        assert!(f.get(k).is_some_and(|x| std::ptr::eq(x, v)), "get({k:?}) must return the stored value");
    }
    std::hint::black_box(acc);
});
