//! An ELF section's bytes as a reader sees them: compressed sections
//! (`SHF_COMPRESSED` or `.zdebug_*`, as Go and `gcc -gz` write
//! `.debug_frame`) inflated, within a cap, since the file is whatever a
//! traced process chose to map.

use std::borrow::Cow;
use std::io::Read;

use object::{CompressionFormat, Object, ObjectSection};

/// Largest section inflated: a crafted header cannot make root allocate
/// without bound.
pub const MAX_INFLATED: u64 = 64 << 20;

#[derive(Debug, PartialEq, Eq)]
pub enum SectionError {
    /// Its bytes (or compressed stream) could not be read.
    Bad,
    /// Inflated, it would be larger than `MAX_INFLATED`.
    TooBig,
}

/// The bytes of section `name` (None: no such section), inflated when the
/// file stores it compressed.
pub fn section_bytes<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    name: &str,
) -> Result<Option<Cow<'d, [u8]>>, SectionError> {
    // object finds `.zdebug_*` under the `.debug_*` name.
    let Some(sec) = obj.section_by_name(name) else {
        return Ok(None);
    };
    let c = sec.compressed_data().map_err(|_| SectionError::Bad)?;
    match c.format {
        CompressionFormat::None => Ok(Some(Cow::Borrowed(c.data))),
        CompressionFormat::Zlib => {
            if c.uncompressed_size > MAX_INFLATED {
                return Err(SectionError::TooBig);
            }
            let mut out = Vec::with_capacity(c.uncompressed_size as usize);
            flate2::read::ZlibDecoder::new(c.data)
                .take(c.uncompressed_size)
                .read_to_end(&mut out)
                .map_err(|_| SectionError::Bad)?;
            if out.len() as u64 != c.uncompressed_size {
                return Err(SectionError::Bad);
            }
            Ok(Some(Cow::Owned(out)))
        }
        _ => Err(SectionError::Bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::write;

    fn elf_with(name: &[u8], data: &[u8], flags: u64) -> Vec<u8> {
        let mut o = write::Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let id = o.add_section(Vec::new(), name.to_vec(), object::SectionKind::Debug);
        o.section_mut(id).set_data(data.to_vec(), 1);
        o.section_mut(id).flags = object::SectionFlags::Elf { sh_flags: flags };
        o.write().unwrap()
    }

    /// `Elf64_Chdr` (zlib, `size`, align 1) then the stream.
    fn chdr(size: u64, stream: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(1u32.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend(size.to_le_bytes());
        v.extend(1u64.to_le_bytes());
        v.extend(stream);
        v
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn compressed_sections_are_inflated_and_plain_ones_borrowed() {
        let body = b"call frame information".repeat(100);
        let plain = elf_with(b".debug_frame", &body, 0);
        let obj = object::File::parse(&*plain).unwrap();
        let got = section_bytes(&obj, ".debug_frame").unwrap().unwrap();
        assert!(matches!(got, Cow::Borrowed(_)));
        assert_eq!(&*got, &body[..]);

        let z = elf_with(
            b".debug_frame",
            &chdr(body.len() as u64, &zlib(&body)),
            object::elf::SHF_COMPRESSED as u64,
        );
        let obj = object::File::parse(&*z).unwrap();
        assert_eq!(
            &*section_bytes(&obj, ".debug_frame").unwrap().unwrap(),
            &body[..]
        );
        assert_eq!(section_bytes(&obj, ".eh_frame"), Ok(None));
    }

    #[test]
    fn a_stated_size_too_large_or_untrue_is_refused() {
        let body = vec![7u8; 4096];
        let huge = elf_with(
            b".debug_frame",
            &chdr(MAX_INFLATED + 1, &zlib(&body)),
            object::elf::SHF_COMPRESSED as u64,
        );
        let obj = object::File::parse(&*huge).unwrap();
        assert_eq!(
            section_bytes(&obj, ".debug_frame"),
            Err(SectionError::TooBig)
        );
        // A stream longer than stated is cut at the size and refused.
        let lie = elf_with(
            b".debug_frame",
            &chdr(100, &zlib(&body)),
            object::elf::SHF_COMPRESSED as u64,
        );
        let obj = object::File::parse(&*lie).unwrap();
        let cut = section_bytes(&obj, ".debug_frame").unwrap().unwrap();
        assert_eq!(&*cut, &body[..100]);
        // Damaged stream.
        let bad = elf_with(
            b".debug_frame",
            &chdr(4096, b"not zlib at all"),
            object::elf::SHF_COMPRESSED as u64,
        );
        let obj = object::File::parse(&*bad).unwrap();
        assert_eq!(section_bytes(&obj, ".debug_frame"), Err(SectionError::Bad));
    }
}
