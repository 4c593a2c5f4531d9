//! A numeric array: its elements in C order, its shape and its numpy dtype string.
//!
//! Section 0: the elements. Section 1: the shape, one u64 LE per dimension (at least one).
//! Section 2: the dtype as numpy writes `dtype.str` (`<i8`, `|b1`, `<f4`, `<c16`): a byte
//! order (`<`, `>`, `|`, `=`), a kind (`b`ool, `i`nt, `u`int, `f`loat, `c`omplex) and the
//! item size in bytes. `count` is the length of the first dimension.

use crate::layout::{self, place, u64_at, Header, Kind};
use crate::SharedError;

/// A dtype string's item size, if it is one of a numeric array's.
pub fn itemsize(dtype: &str) -> Result<usize, SharedError> {
    let bad = || {
        SharedError::BadInput(format!(
            "dtype {dtype:?} is not a numeric dtype (bool, integer, float or complex)"
        ))
    };
    let b = dtype.as_bytes();
    if b.len() < 3 || !b"<>|=".contains(&b[0]) || !b"biufc".contains(&b[1]) {
        return Err(bad());
    }
    let size: usize = dtype[2..].parse().map_err(|_| bad())?;
    if ![1, 2, 4, 8, 16].contains(&size) {
        return Err(bad());
    }
    Ok(size)
}

/// The header (hash still zero) and region length of an array of `dtype` and `shape`.
pub fn array_layout(dtype: &str, shape: &[usize]) -> Result<(Header, usize), SharedError> {
    let size = itemsize(dtype)?;
    if shape.is_empty() {
        return Err(SharedError::BadInput(
            "a shared array has at least one dimension".into(),
        ));
    }
    let data = shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| SharedError::TooLarge("the array".into()))?;
    let (sections, len) = place(&[data, 8 * shape.len(), dtype.len()])?;
    Ok((
        Header {
            kind: Kind::Array,
            param: 0,
            count: shape[0] as u64,
            hash: [0; 16],
            sections,
        },
        len,
    ))
}

/// Writes the shape and dtype of `header` (from [`array_layout`]) into `region`, and returns the
/// elements' section to fill.
pub fn write_meta<'a>(
    region: &'a mut [u8],
    header: &Header,
    dtype: &str,
    shape: &[usize],
) -> &'a mut [u8] {
    let [data, dims, dt, _] = header.sections;
    for (k, &d) in shape.iter().enumerate() {
        let at = dims.offset + 8 * k;
        region[at..at + 8].copy_from_slice(&(d as u64).to_le_bytes());
    }
    region[dt.offset..dt.end()].copy_from_slice(dtype.as_bytes());
    &mut region[data.offset..data.end()]
}

/// Reads an array in a region.
pub struct ArrayView<'a> {
    pub data: &'a [u8],
    pub shape: Vec<usize>,
    pub dtype: &'a str,
    pub itemsize: usize,
}

impl<'a> ArrayView<'a> {
    pub fn new(region: &'a [u8], header: &Header) -> Result<ArrayView<'a>, SharedError> {
        let corrupt = |why: String| SharedError::Corrupt(why);
        if header.kind != Kind::Array {
            return Err(corrupt("the region does not hold an array".into()));
        }
        let [data, dims, dt, _] = header.sections;
        let dtype = std::str::from_utf8(layout::bytes(region, dt))
            .map_err(|_| corrupt("the array's dtype is not text".into()))?;
        let itemsize = itemsize(dtype).map_err(|e| corrupt(e.to_string()))?;
        if dims.len == 0 || dims.len % 8 != 0 {
            return Err(corrupt("the array has no shape".into()));
        }
        let dim_bytes = layout::bytes(region, dims);
        let shape = (0..dims.len / 8)
            .map(|k| layout::to_usize(u64_at(dim_bytes, 8 * k), "a dimension"))
            .collect::<Result<Vec<_>, _>>()?;
        let need = shape.iter().try_fold(itemsize, |n, &d| n.checked_mul(d));
        if need != Some(data.len) || shape[0] as u64 != header.count {
            return Err(corrupt(format!(
                "an array of shape {shape:?} and dtype {dtype} does not fit its {} bytes",
                data.len
            )));
        }
        Ok(ArrayView {
            data: layout::bytes(region, data),
            shape,
            dtype,
            itemsize,
        })
    }

    /// The bytes of one row (one element of a 1-D array): row `i` < shape[0].
    pub fn row(&self, i: usize) -> &'a [u8] {
        let row = self.data.len() / self.shape[0].max(1);
        &self.data[i * row..(i + 1) * row]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn itemsizes_of_numeric_dtypes() {
        assert_eq!(itemsize("<i8").unwrap(), 8);
        assert_eq!(itemsize("|b1").unwrap(), 1);
        assert_eq!(itemsize("<c16").unwrap(), 16);
        for bad in ["", "<i", "<O8", "|S10", "<U4", "<i3", "xi8", "<M8", "<f4x"] {
            assert!(itemsize(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_array_round_trips() {
        let (h, len) = array_layout("<i4", &[3, 2]).unwrap();
        let mut region = vec![0u8; len];
        h.write(&mut region);
        let data = write_meta(&mut region, &h, "<i4", &[3, 2]);
        for (k, x) in (0..6i32).enumerate() {
            data[4 * k..4 * k + 4].copy_from_slice(&(x * 10).to_le_bytes());
        }
        let v = ArrayView::new(&region, &Header::parse(&region).unwrap()).unwrap();
        assert_eq!(v.shape, vec![3, 2]);
        assert_eq!(v.dtype, "<i4");
        assert_eq!(v.row(2), &[40, 0, 0, 0, 50, 0, 0, 0]);
    }

    #[test]
    fn a_shape_that_does_not_fit_is_refused() {
        let (h, len) = array_layout("<f8", &[4]).unwrap();
        let mut region = vec![0u8; len];
        h.write(&mut region);
        write_meta(&mut region, &h, "<f8", &[5]);
        let e = ArrayView::new(&region, &Header::parse(&region).unwrap());
        assert!(matches!(e, Err(SharedError::Corrupt(_))));
        assert!(array_layout("<f8", &[]).is_err());
        assert!(array_layout("<f8", &[usize::MAX, 2]).is_err());
    }
}
