//! The soname of a shared library (`DT_SONAME`), read from its ELF
//! headers the way `ldconfig` does, to make the links `update-ldcache`
//! would have made. Pure over a read function: the file is the host's
//! driver library, and only the headers and the few bytes they point at
//! are read, each read bounded by the file's length.

/// ELF64, little-endian (x86-64, aarch64): the hosts ptrain runs on.
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;
/// More program headers than any library has.
const MAX_PHNUM: usize = 512;
/// More dynamic entries than any library has.
const MAX_DYNAMIC: usize = 4096;
/// A soname longer than this is not one.
const MAX_SONAME: usize = 255;

/// The soname of the ELF file of `len` bytes read through `read(offset,
/// size)` (`None` when a read fails or falls outside the file); `None` when
/// it is no ELF64 little-endian shared object with a soname.
pub fn soname(len: u64, mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>) -> Option<String> {
    let mut read_in = |offset: u64, size: usize| -> Option<Vec<u8>> {
        let end = offset.checked_add(size as u64)?;
        if end > len {
            return None;
        }
        read(offset, size)
    };
    let header = read_in(0, 64)?;
    if header[..4] != *b"\x7fELF" || header[4] != ELFCLASS64 || header[5] != ELFDATA2LSB {
        return None;
    }
    let phoff = u64_at(&header, 0x20)?;
    let phentsize = u16_at(&header, 0x36)? as usize;
    let phnum = u16_at(&header, 0x38)? as usize;
    if phentsize < 56 || phnum == 0 || phnum > MAX_PHNUM {
        return None;
    }
    let table = read_in(phoff, phentsize * phnum)?;
    // (vaddr, offset, filesz) of each PT_LOAD; the PT_DYNAMIC's (offset, size).
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let ph = &table[i * phentsize..(i + 1) * phentsize];
        let p_type = u32_at(ph, 0)?;
        let offset = u64_at(ph, 8)?;
        let vaddr = u64_at(ph, 16)?;
        let filesz = u64_at(ph, 32)?;
        match p_type {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let (dyn_offset, dyn_size) = dynamic?;
    let count = (dyn_size as usize / 16).min(MAX_DYNAMIC);
    let entries = read_in(dyn_offset, count * 16)?;
    let (mut strtab, mut name) = (None, None);
    for entry in entries.chunks_exact(16) {
        let tag = u64_at(entry, 0)?;
        let value = u64_at(entry, 8)?;
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(value),
            DT_SONAME => name = Some(value),
            _ => {}
        }
    }
    let (strtab, name) = (strtab?, name?);
    // DT_STRTAB is an address: the file offset is where a PT_LOAD maps it.
    let strtab_offset = loads.iter().find_map(|&(vaddr, offset, filesz)| {
        (strtab >= vaddr && strtab - vaddr < filesz).then(|| strtab - vaddr + offset)
    })?;
    let start = strtab_offset.checked_add(name)?;
    let size = (len.saturating_sub(start) as usize).min(MAX_SONAME + 1);
    let bytes = read_in(start, size)?;
    let end = bytes.iter().position(|&b| b == 0)?;
    String::from_utf8(bytes[..end].to_vec())
        .ok()
        .filter(|s| !s.is_empty())
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
