//! `rloader.vision`'s decoding and transforms: an encoded file (`EncodedImage`), and a
//! sample's steps run on it without the GIL (rloader-vision does the pixel work).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use rloader_memory::BatchMemory;
use rloader_vision::decode::{self, take_decode_time, Format, Header, NotHandled};
use rloader_vision::image::ImageView;
use rloader_vision::plan::{self, Output, Step};
use rloader_vision::resample::Filter;
use rloader_vision::tensor::{write_chw, Table};

use crate::memory::pooled_empty;
use crate::torch_api::torch_api;

/// Nanoseconds this process has spent in samples' decoding and in their other steps (resampling,
/// conversion to the output), for `DataLoader.stats()`: each reader keeps its own start.
static NANOS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// (decode, transform) nanoseconds this process has spent in `EncodedImage.run` so far.
pub fn nanos() -> [u64; 2] {
    [NANOS[0].load(Relaxed), NANOS[1].load(Relaxed)]
}

/// A file's bytes and header, read without the GIL; `None` from `open` where Pillow must decode
/// it (the reason in `vision_open`'s second value).
#[pyclass(frozen, module = "rloader._rloader")]
pub struct EncodedImage {
    data: Vec<u8>,
    header: Header,
}

/// Reads `path` and its header without the GIL: `(EncodedImage, None)`, or `(None, why)` for a
/// file to leave to Pillow (unreadable, another format, a mode not reproduced exactly).
#[pyfunction]
pub fn vision_open(py: Python<'_>, path: PathBuf) -> (Option<EncodedImage>, Option<String>) {
    py.detach(|| open(&path))
}

/// `vision_open` for each path, the GIL released once for them all.
#[pyfunction]
pub fn vision_open_many(
    py: Python<'_>,
    paths: Vec<PathBuf>,
) -> Vec<(Option<EncodedImage>, Option<String>)> {
    py.detach(|| paths.iter().map(|path| open(path)).collect())
}

fn open(path: &std::path::Path) -> (Option<EncodedImage>, Option<String>) {
    let data = match std::fs::read(path) {
        Ok(data) => data,
        Err(err) => return (None, Some(err.to_string())),
    };
    match decode::probe(&data) {
        Ok(header) => (Some(EncodedImage { data, header }), None),
        Err(why) => (None, Some(reason(why))),
    }
}

fn reason(why: NotHandled) -> String {
    match why {
        NotHandled::Unsupported(s) | NotHandled::DecodeFailed(s) => s,
    }
}

#[pymethods]
impl EncodedImage {
    /// The decoded size at full scale.
    #[getter]
    fn size(&self) -> (usize, usize) {
        (self.header.width, self.header.height)
    }

    /// "JPEG" or "PNG".
    #[getter]
    fn format(&self) -> &'static str {
        match self.header.format {
            Format::Jpeg => "JPEG",
            Format::Png => "PNG",
        }
    }

    /// `steps` (tuples, as `parse_steps` reads them) parsed once for this image decoded at
    /// `1/scale_denom`, with the size they make: what `run` and `vision_run_many` take.
    fn steps(&self, scale_denom: usize, steps: Vec<Bound<'_, PyTuple>>) -> PyResult<SampleSteps> {
        if ![1, 2, 4, 8].contains(&scale_denom) {
            return Err(PyValueError::new_err(format!(
                "scale_denom {scale_denom}: 1, 2, 4 or 8"
            )));
        }
        let source = decode::scaled_size(&self.header, scale_denom);
        let steps = parse_steps(&steps)?;
        Ok(SampleSteps {
            scale_denom,
            source,
            size: plan::output_size(source.0, source.1, &steps),
            steps,
        })
    }

    /// Decodes at `steps`' scale, runs them and writes the result to the `out_len` bytes at
    /// `out_ptr`: CHW through `table` (`channels` tables of 256 values of `elem` bytes), or
    /// RGB bytes without one. False (nothing written that counts) where the decoder failed
    /// or warned: the caller gives the file to Pillow. `draft`: a JPEG may decode at a reduced
    /// scale where the steps reduce it anyway (approximate pixels, the same size; see
    /// rloader-vision's NOTE [Draft]).
    ///
    /// SAFETY (the caller's): `out_ptr` is the start of `out_len` writable bytes that stay
    /// alive and untouched by anyone else until this returns (a fresh tensor's storage, which
    /// the caller holds), exactly the output's size.
    #[pyo3(signature = (steps, out_ptr, out_len, table=None, elem=0, channels=0, *, draft=false))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        steps: &Bound<'_, SampleSteps>,
        out_ptr: usize,
        out_len: usize,
        table: Option<Bound<'_, PyBytes>>,
        elem: usize,
        channels: usize,
        draft: bool,
    ) -> PyResult<bool> {
        let output = output(table.as_ref().map(|t| t.as_bytes()), elem, channels)?;
        let job = Job::new(self, steps.get(), &output, out_ptr, out_len)?;
        Ok(py.detach(move || job.run(self, &output, draft)))
    }
}

/// A sample's steps, parsed once (`EncodedImage.steps`) for an image of one size at one scale,
/// and the size they make from it.
#[pyclass(frozen, module = "rloader._rloader")]
pub struct SampleSteps {
    scale_denom: usize,
    /// The decoded size they were parsed for.
    source: (usize, usize),
    size: (usize, usize),
    steps: Vec<Step>,
}

#[pymethods]
impl SampleSteps {
    /// The output's size (width, height).
    #[getter]
    fn size(&self) -> (usize, usize) {
        self.size
    }
}

/// Runs each image's steps into its output, as `EncodedImage.run` does one, with
/// the GIL released once for them all: `outs` are `(out_ptr, out_len)` pairs under its SAFETY
/// contract. Stops at the first image whose decoder failed or warned: how many were written.
#[pyfunction]
#[pyo3(signature = (images, steps, outs, table=None, elem=0, channels=0, *, draft=false))]
#[allow(clippy::too_many_arguments)]
pub fn vision_run_many(
    py: Python<'_>,
    images: Vec<Py<EncodedImage>>,
    steps: Vec<Py<SampleSteps>>,
    outs: Vec<(usize, usize)>,
    table: Option<Bound<'_, PyBytes>>,
    elem: usize,
    channels: usize,
    draft: bool,
) -> PyResult<usize> {
    if steps.len() != images.len() || outs.len() != images.len() {
        return Err(PyValueError::new_err(
            "images, steps and outs: one of each per sample",
        ));
    }
    let output = output(table.as_ref().map(|t| t.as_bytes()), elem, channels)?;
    let jobs = images
        .iter()
        .zip(&steps)
        .zip(&outs)
        .map(|((image, steps), &(ptr, len))| Job::new(image.get(), steps.get(), &output, ptr, len))
        .collect::<PyResult<Vec<Job>>>()?;
    Ok(py.detach(|| {
        (jobs.iter().zip(&images))
            .take_while(|(job, image)| job.run(image.get(), &output, draft))
            .count()
    }))
}

/// Writes `rgb` (a `width` x `height` RGB image's bytes, as Pillow's `tobytes()` gives them)
/// to the `out_len` bytes at `out_ptr` as CHW through `table`, as `EncodedImage.run` writes
/// its output, without the GIL (a PIL image that torchvision transforms made, converted as
/// the plan's conversion would). Same SAFETY contract as `EncodedImage.run`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn vision_convert(
    py: Python<'_>,
    rgb: &Bound<'_, PyBytes>,
    width: usize,
    height: usize,
    out_ptr: usize,
    out_len: usize,
    table: &Bound<'_, PyBytes>,
    elem: usize,
    channels: usize,
) -> PyResult<()> {
    let output = output(Some(table.as_bytes()), elem, channels)?;
    let Output::Chw(table) = &output else {
        unreachable!("a table was given")
    };
    let rgb = rgb.as_bytes();
    if rgb.len() != width * height * 3 {
        return Err(PyValueError::new_err(format!(
            "{} bytes of RGB for {width}x{height}",
            rgb.len()
        )));
    }
    if out_len != channels * width * height * elem || out_ptr == 0 {
        return Err(PyValueError::new_err(format!(
            "output of {out_len} bytes; {} needed",
            channels * width * height * elem
        )));
    }
    py.detach(|| {
        // SAFETY: the caller's contract: out_len live, writable bytes no one else touches
        // until this returns.
        let out = unsafe { std::slice::from_raw_parts_mut(out_ptr as *mut u8, out_len) };
        write_chw(ImageView::new(width, height, 3, rgb), table, out);
    });
    Ok(())
}

/// How a sample's pixels are written: CHW through `table` (`channels` tables of 256 values of
/// `elem` bytes), or RGB bytes without one.
fn output(table: Option<&[u8]>, elem: usize, channels: usize) -> PyResult<Output<'_>> {
    Ok(match table {
        Some(values) => {
            if values.len() != channels * 256 * elem || ![1, 2, 4, 8].contains(&elem) {
                return Err(PyValueError::new_err(
                    "table: channels * 256 values of 1, 2, 4 or 8 bytes",
                ));
            }
            Output::Chw(Table {
                values,
                elem,
                channels,
            })
        }
        None => Output::Rgb,
    })
}

/// One sample's work, checked with the GIL held: its steps and where its output goes.
struct Job<'a> {
    steps: &'a SampleSteps,
    out_ptr: usize,
    out_len: usize,
}

impl<'a> Job<'a> {
    /// Checks that `steps` were parsed for `image`'s size and that the `out_len` bytes at
    /// `out_ptr` are exactly the output's size.
    fn new(
        image: &EncodedImage,
        steps: &'a SampleSteps,
        output: &Output,
        out_ptr: usize,
        out_len: usize,
    ) -> PyResult<Self> {
        if decode::scaled_size(&image.header, steps.scale_denom) != steps.source {
            return Err(PyValueError::new_err(
                "steps parsed for an image of another size",
            ));
        }
        let (w, h) = steps.size;
        let expected = match output {
            Output::Chw(t) => t.channels * w * h * t.elem,
            Output::Rgb => w * h * 3,
        };
        if out_len != expected || out_ptr == 0 {
            return Err(PyValueError::new_err(format!(
                "output of {out_len} bytes; {expected} needed"
            )));
        }
        Ok(Job {
            steps,
            out_ptr,
            out_len,
        })
    }

    /// Runs the steps on `image` (without the GIL), adding the time to `NANOS`: true where
    /// the sample was written.
    fn run(&self, image: &EncodedImage, output: &Output, draft: bool) -> bool {
        // SAFETY: the caller's contract (`EncodedImage.run`): out_len live, writable bytes no
        // one else touches until the call returns.
        let out = unsafe { std::slice::from_raw_parts_mut(self.out_ptr as *mut u8, self.out_len) };
        let run = if draft { plan::run_draft } else { plan::run };
        take_decode_time();
        let started = Instant::now();
        let ok = run(
            &image.data,
            &image.header,
            self.steps.scale_denom,
            &self.steps.steps,
            output,
            out,
        )
        .is_ok();
        let total = started.elapsed();
        let decode = take_decode_time();
        NANOS[0].fetch_add(decode.as_nanos() as u64, Relaxed);
        NANOS[1].fetch_add(total.saturating_sub(decode).as_nanos() as u64, Relaxed);
        ok
    }
}

fn filter(code: &str) -> PyResult<Filter> {
    Ok(match code {
        "nearest" => Filter::Nearest,
        "box" => Filter::Box,
        "bilinear" => Filter::Bilinear,
        "hamming" => Filter::Hamming,
        "bicubic" => Filter::Bicubic,
        "lanczos" => Filter::Lanczos,
        other => {
            return Err(PyValueError::new_err(format!(
                "no resampling filter {other:?}"
            )))
        }
    })
}

/// Steps as Python writes them: `("crop", left, top, right, bottom)`,
/// `("resize", width, height, filter, x0, y0, x1, y1)`, `("flip_lr",)`, `("flip_tb",)`.
fn parse_steps(steps: &[Bound<'_, PyTuple>]) -> PyResult<Vec<Step>> {
    steps
        .iter()
        .map(|t| {
            let kind: String = t.get_item(0)?.extract()?;
            Ok(match kind.as_str() {
                "crop" => {
                    let (_, left, top, right, bottom): (String, i64, i64, i64, i64) =
                        t.extract()?;
                    Step::Crop {
                        left,
                        top,
                        right,
                        bottom,
                    }
                }
                "resize" => {
                    let (_, width, height, f, x0, y0, x1, y1): (
                        String,
                        usize,
                        usize,
                        String,
                        f64,
                        f64,
                        f64,
                        f64,
                    ) = t.extract()?;
                    Step::Resize {
                        width,
                        height,
                        filter: filter(&f)?,
                        bbox: [x0, y0, x1, y1],
                    }
                }
                "flip_lr" => Step::FlipLeftRight,
                "flip_tb" => Step::FlipTopBottom,
                other => return Err(PyValueError::new_err(format!("no step {other:?}"))),
            })
        })
        .collect()
}

/// Recycled memory for samples' output tensors (rloader-memory's `BatchMemory`): a fresh
/// 600 KB tensor per sample faults in its pages every time (glibc maps allocations that large
/// anew and unmaps them when freed), which cost as much as decoding on a VM; a block comes
/// back when the last tensor over it is gone (NOTE [Batch memory]), and is handed out again.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct SamplePool(BatchMemory);

#[pymethods]
impl SamplePool {
    /// A pool that keeps at most `max_free` blocks nobody uses.
    #[new]
    fn new(max_free: usize) -> Self {
        SamplePool(BatchMemory::new(max_free))
    }

    /// An uninitialized contiguous tensor of `shape` and `dtype` (`nbytes` bytes) over a block.
    fn empty<'py>(
        &self,
        py: Python<'py>,
        shape: Vec<isize>,
        dtype: &Bound<'py, PyAny>,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        pooled_empty(py, torch_api(py)?, &self.0, &shape, dtype, nbytes)
    }
}

/// Which order of resampling passes to reproduce: Pillow 13's (`True`) or older Pillow's.
#[pyfunction]
pub fn vision_pillow_13_passes(on: bool) {
    rloader_vision::resample::set_vertical_first_rule(on);
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EncodedImage>()?;
    m.add_class::<SampleSteps>()?;
    m.add_class::<SamplePool>()?;
    m.add_function(wrap_pyfunction!(vision_open, m)?)?;
    m.add_function(wrap_pyfunction!(vision_open_many, m)?)?;
    m.add_function(wrap_pyfunction!(vision_run_many, m)?)?;
    m.add_function(wrap_pyfunction!(vision_convert, m)?)?;
    m.add_function(wrap_pyfunction!(vision_pillow_13_passes, m)?)?;
    Ok(())
}
