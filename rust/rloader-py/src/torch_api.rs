//! The torch (and numpy) objects this crate calls, looked up once per process: the collate fast
//! path's, and the tensors made over slots and pooled blocks (memory/).

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The torch and numpy objects the crate calls, looked up once per process.
pub struct TorchApi {
    pub empty: Py<PyAny>,
    pub frombuffer: Py<PyAny>,
    pub stack: Py<PyAny>,
    pub get_num_threads: Py<PyAny>,
    /// `torch._C._is_torch_function_mode_enabled` and `torch._C._len_torch_dispatch_stack`.
    pub function_mode: Py<PyAny>,
    pub dispatch_modes: Py<PyAny>,
    /// `torch.is_inference_mode_enabled`, `sys.is_finalizing`.
    pub inference_mode: Py<PyAny>,
    pub is_finalizing: Py<PyAny>,
    /// `torch._C._autograd._unsafe_set_version_counter`, where this torch has it.
    pub set_version: Option<Py<PyAny>>,
    pub tensor_type: Py<PyType>,
    pub strided: Py<PyAny>,
    pub int64: Py<PyAny>,
    pub float64: Py<PyAny>,
    pub bool_: Py<PyAny>,
    pub ndarray_type: Option<Py<PyType>>,
    /// numpy buffer format character → the torch dtype `torch.as_tensor` gives.
    pub dtypes: HashMap<&'static str, (Py<PyAny>, usize)>,
}

static TORCH_API: PyOnceLock<TorchApi> = PyOnceLock::new();

pub fn torch_api(py: Python<'_>) -> PyResult<&TorchApi> {
    TORCH_API.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(torch.getattr(name)?.unbind()) };
        let torch_c = torch.getattr("_C")?;
        let ndarray_type = match py.import("numpy") {
            Ok(np) => Some(np.getattr("ndarray")?.cast_into::<PyType>()?.unbind()),
            Err(_) => None,
        };
        let mut dtypes = HashMap::new();
        for (fmt, name, size) in [
            ("?", "bool", 1),
            ("b", "int8", 1),
            ("B", "uint8", 1),
            ("h", "int16", 2),
            ("i", "int32", 4),
            ("l", "int64", 8),
            ("q", "int64", 8),
            ("e", "float16", 2),
            ("f", "float32", 4),
            ("d", "float64", 8),
            ("Zf", "complex64", 8),
            ("Zd", "complex128", 16),
        ] {
            dtypes.insert(fmt, (get(name)?, size));
        }
        Ok(TorchApi {
            empty: get("empty")?,
            frombuffer: get("frombuffer")?,
            stack: get("stack")?,
            get_num_threads: get("get_num_threads")?,
            function_mode: torch_c.getattr("_is_torch_function_mode_enabled")?.unbind(),
            dispatch_modes: torch_c.getattr("_len_torch_dispatch_stack")?.unbind(),
            inference_mode: get("is_inference_mode_enabled")?,
            is_finalizing: py.import("sys")?.getattr("is_finalizing")?.unbind(),
            set_version: torch_c
                .getattr("_autograd")
                .and_then(|a| a.getattr("_unsafe_set_version_counter"))
                .ok()
                .map(Bound::unbind),
            tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            strided: get("strided")?,
            int64: get("int64")?,
            float64: get("float64")?,
            bool_: get("bool")?,
            ndarray_type,
            dtypes,
        })
    })
}

/// Bytes of a tensor of `shape` and `dtype`; None for a negative dimension.
pub fn nbytes_of(shape: &[isize], dtype: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    let mut n: usize = dtype.getattr("itemsize")?.extract()?;
    for &d in shape {
        let Ok(d) = usize::try_from(d) else {
            return Ok(None);
        };
        n = n.saturating_mul(d);
    }
    Ok(Some(n))
}
