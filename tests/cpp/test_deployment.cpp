// Python-free deployment: a TorchScript module and an AOTInductor package whose forward appends
// through nvfp4kv, made by make_deployment_artifacts.py, loaded and run here with nvfp4kv linked (no
// Python, no dlopen: the ops are registered because libnvfp4kv.so is a load-time dependency). Every
// cache byte and the output must equal what Python computed.
#include <gtest/gtest.h>
#include <nvfp4kv/nvfp4kv.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

constexpr int kCacheInputs[] = {4, 5, 6, 7};  // k_cache, v_cache, k_cache_sf, v_cache_sf

std::string artifact(const std::string& name) {
  const char* folder = std::getenv("NVFP4KV_ARTIFACTS");
  if (folder == nullptr)
    throw std::runtime_error("set NVFP4KV_ARTIFACTS to the folder of make_deployment_artifacts.py");
  return std::string(folder) + "/" + name;
}

struct Case {
  std::vector<at::Tensor> inputs;  // fresh copies, ready to be mutated
  std::vector<at::Tensor> caches;  // uint8 bytes of the caches after Python's eager call
  at::Tensor output;
};

Case load_case(const std::string& name) {
  std::ifstream file(artifact("cases.pt"), std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const c10::Dict<c10::IValue, c10::IValue> cases = torch::pickle_load(bytes).toGenericDict();
  const c10::Dict<c10::IValue, c10::IValue> entry = cases.at(name).toGenericDict();
  Case result;
  for (const c10::IValue& t : entry.at("inputs").toListRef()) result.inputs.push_back(t.toTensor().clone());
  for (int i : {6, 7}) result.inputs[i] = result.inputs[i].view(at::kFloat8_e4m3fn);  // scales travel as bytes
  for (const c10::IValue& t : entry.at("caches").toListRef()) result.caches.push_back(t.toTensor());
  result.output = entry.at("output").toTensor();
  return result;
}

void expect_same_bytes(const Case& c, const at::Tensor& output) {
  for (size_t i = 0; i < std::size(kCacheInputs); ++i) {
    EXPECT_TRUE(at::equal(c.inputs[kCacheInputs[i]].view(at::kByte).cpu(), c.caches[i]))
        << "cache input " << kCacheInputs[i];
  }
  ASSERT_EQ(output.scalar_type(), at::kFloat);
  // The dequantized cache, NaN where a poisoned scale byte decodes to NaN.
  const at::Tensor actual = output.cpu();
  EXPECT_TRUE(at::equal(at::isnan(actual), at::isnan(c.output)));
  EXPECT_TRUE(at::equal(at::nan_to_num(actual, 0.0), at::nan_to_num(c.output, 0.0)));
}

Case on_cuda(Case c) {
  for (at::Tensor& t : c.inputs) t = t.to(at::Device(at::kCUDA, 0));
  return c;
}

TEST(TorchScript, ScriptedModuleWritesThePythonBytes) {
  Case c = load_case("torchscript");
  torch::jit::script::Module module = torch::jit::load(artifact("append_hnd.torchscript.pt"));
  std::vector<c10::IValue> inputs(c.inputs.begin(), c.inputs.end());
  const at::Tensor output = module.forward(inputs).toTensor();
  expect_same_bytes(c, output);
}

TEST(AOTInductor, PackageWritesThePythonBytes) {
  Case c = load_case("aoti");
  torch::inductor::AOTIModelPackageLoader loader(artifact("append_nhd.pt2"));
  const std::vector<at::Tensor> outputs = loader.run(c.inputs);
  ASSERT_EQ(outputs.size(), 1u);
  expect_same_bytes(c, outputs[0]);
}

TEST(AOTInductor, PackageRunsTwiceOnFreshInputs) {
  // A deployed model is run many times: the second run on fresh inputs writes the same bytes again.
  torch::inductor::AOTIModelPackageLoader loader(artifact("append_nhd.pt2"));
  for (int run = 0; run < 2; ++run) {
    Case c = load_case("aoti");
    expect_same_bytes(c, loader.run(c.inputs)[0]);
  }
}

// On a GPU machine (tests/gpu/run_cpp_device.sh): the same TorchScript module on CUDA tensors, and
// an AOTInductor package compiled for CUDA, write the bytes Python wrote on the CPU.
TEST(TorchScript, ScriptedModuleOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Case c = on_cuda(load_case("torchscript"));
  torch::jit::script::Module module = torch::jit::load(artifact("append_hnd.torchscript.pt"));
  std::vector<c10::IValue> inputs(c.inputs.begin(), c.inputs.end());
  const at::Tensor output = module.forward(inputs).toTensor();
  EXPECT_TRUE(output.is_cuda());
  expect_same_bytes(c, output);
}

TEST(AOTInductor, CudaPackage) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Case c = on_cuda(load_case("aoti"));
  torch::inductor::AOTIModelPackageLoader loader(artifact("append_nhd_cuda.pt2"));
  const std::vector<at::Tensor> outputs = loader.run(c.inputs);
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_TRUE(outputs[0].is_cuda());
  expect_same_bytes(c, outputs[0]);
}

}  // namespace
