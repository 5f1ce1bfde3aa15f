// Bind the fake driver's references to its own definitions (as a real driver does):
// its internal calls and the addresses `cuGetProcAddress` hands out must stay the
// fake's own, even when libfgpu.so interposes the same names.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
