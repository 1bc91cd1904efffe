//! Reader for the "DSQF" fixture container written by tools/reference/quant_fixtures.py.
#![allow(dead_code)]

use std::collections::HashMap;

pub struct Record {
    pub name: String,
    pub ty: u32,
    pub fields: HashMap<String, Vec<u8>>,
}

impl Record {
    pub fn bytes(&self, k: &str) -> &[u8] {
        &self.fields[k]
    }
    pub fn f32s(&self, k: &str) -> Vec<f32> {
        self.fields[k].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    pub fn u32(&self, k: &str) -> u32 {
        u32::from_le_bytes(self.fields[k][..4].try_into().unwrap())
    }
}

pub fn load(name: &str) -> Vec<Record> {
    let path = format!("{}/tests/fixtures/{}", env!("CARGO_MANIFEST_DIR"), name);
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&b[0..4], b"DSQF");
    let mut p = 4usize;
    let u32_ = |p: &mut usize| {
        let v = u32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
        *p += 4;
        v
    };
    assert_eq!(u32_(&mut p), 1);
    let n = u32_(&mut p);
    let mut out = Vec::new();
    for _ in 0..n {
        let s = |p: &mut usize| {
            let l = u16::from_le_bytes(b[*p..*p + 2].try_into().unwrap()) as usize;
            let v = String::from_utf8(b[*p + 2..*p + 2 + l].to_vec()).unwrap();
            *p += 2 + l;
            v
        };
        let name = s(&mut p);
        let ty = u32_(&mut p);
        let nf = u32_(&mut p);
        let mut fields = HashMap::new();
        for _ in 0..nf {
            let k = s(&mut p);
            let l = u32_(&mut p) as usize;
            fields.insert(k, b[p..p + l].to_vec());
            p += l;
        }
        out.push(Record { name, ty, fields });
    }
    out
}
