//! rloader.vision's pixel work, without Python: what torchvision's `ImageFolder` with its
//! transforms does to a file, reproduced bit for bit.
//!
//! - `image.rs`: `Image`, 8-bit pixels, interleaved (L or RGB), as Pillow holds them;
//! - `decode/`: JPEG (libjpeg-turbo, Pillow's decoder, with Pillow's settings) and PNG, to the
//!   pixels Pillow's `Image.open(f).convert("RGB")` gives;
//! - `resample.rs`: Pillow's `Image.resize` (every filter, a box), its fixed-point arithmetic;
//! - `geometry.rs`: Pillow's `crop` and `transpose` (flips);
//! - `tensor.rs`: HWC bytes to CHW tensors as torchvision's `ToTensor`, `PILToTensor`,
//!   `ToDtype` and `Normalize` compute them (torch's float32 arithmetic);
//! - `plan.rs`: the steps a transform pipeline becomes, run in one pass over a sample.

pub mod decode;
pub mod geometry;
pub mod image;
pub mod plan;
pub mod resample;
pub mod tensor;
