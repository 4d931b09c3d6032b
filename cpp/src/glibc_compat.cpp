// Compiled only into a library linked against older glibc stubs (cmake/glibc_stubs.cmake): the two symbols
// whose versions are newer than that glibc (and GCC 8's libstdc++) are defined here instead, hidden, so they
// serve this library's own references and interpose nothing else.
#include <new>
#include <sstream>

extern "C" {
// glibc 2.32: libstdc++'s headers read it to skip atomic reference counting in single-threaded programs;
// 0 ("maybe threaded") keeps the counting atomic, which is always correct.
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

// GLIBCXX_3.4.26 (GCC 9) split the default constructors of the string streams off their openmode
// constructors; these forward to the older ones.
__attribute__((visibility("hidden"))) void nvfp4kv_default_ostringstream(void* self) __asm__(
    "_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev");
__attribute__((visibility("hidden"))) void nvfp4kv_default_stringstream(void* self) __asm__(
    "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev");
}

void nvfp4kv_default_ostringstream(void* self) { ::new (self) std::ostringstream(std::ios_base::out); }
void nvfp4kv_default_stringstream(void* self) {
  ::new (self) std::stringstream(std::ios_base::in | std::ios_base::out);
}
