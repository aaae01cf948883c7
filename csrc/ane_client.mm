// The ane backend: Apple's private AppleNeuralEngine framework, driven with the sequence of
// docs/hardware.md §2. Thin on purpose: what to write where, the weight dictionary, the binding order,
// the retry policy, the compile budget and the front-end checks are decided by portable code
// (runtime/ane_plan, runtime/program, runtime/budget, frontend/) that is tested on Linux.
// This file only performs the calls.
//
// Portability rules (it is compiled by Apple clang on macOS and by clang + GNUstep on Linux for
// the test harness):
// - the private classes are looked up by name and their selectors declared in a category on
//   NSObject (no objc_msgSend casts, nothing links against the framework);
// - manual retain/release (no ARC), NSAutoreleasePool objects (not @autoreleasepool);
// - nullptr for C pointer arguments, nil for objects;
// - no C++ `catch` in this file: under the GCC Objective-C runtime (GNUstep on Debian) clang gives
//   Objective-C++ functions the Objective-C personality, which runs destructors while a C++
//   exception unwinds but cannot catch one. Cleanup is therefore RAII only.
// - every framework call runs inside guarded() (@try/@catch, as libane does): an Objective-C
//   exception becomes the CompileError or EvaluateError of that step, with the framework's reason.
//   Nothing inside a guarded block throws a C++ exception.
#import <Foundation/Foundation.h>
#include <IOSurface/IOSurface.h>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ane_client.h"
#include "frontend/frontend.h"
#include "errors.h"
#include "runtime/ane_plan.h"
#include "runtime/budget.h"

// docs/hardware.md §2: the selectors of _ANEInMemoryModelDescriptor, _ANEInMemoryModel, _ANERequest
// and _ANEIOSurfaceObject, with their argument types.
@interface NSObject (OrionANEPrivateAPI)
+ (id)modelWithMILText:(NSData*)text weights:(NSDictionary*)weights optionsPlist:(NSDictionary*)options;
+ (id)inMemoryModelWithDescriptor:(id)descriptor;
- (NSString*)hexStringIdentifier;
- (BOOL)compileWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error;
- (BOOL)loadWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error;
- (BOOL)evaluateWithQoS:(unsigned int)qos options:(NSDictionary*)options request:(id)request error:(NSError**)error;
- (BOOL)unloadWithQoS:(unsigned int)qos error:(NSError**)error;
- (BOOL)compiledModelExists;
+ (id)objectWithIOSurface:(IOSurfaceRef)surface;
+ (id)requestWithInputs:(NSArray*)inputs
           inputIndices:(NSArray*)inputIndices
                outputs:(NSArray*)outputs
          outputIndices:(NSArray*)outputIndices
          weightsBuffer:(id)weightsBuffer
              perfStats:(id)perfStats
         procedureIndex:(NSNumber*)procedureIndex;
@end

namespace orion::ane {

namespace plan = runtime::ane_plan;

namespace {

// Harness builds only (ORION_ANE_FAULT_INJECTION): ORION_ANE_FAULT=name[,name] makes this client
// break one requirement on purpose, so the harness tests can show the stand-in framework catches
// it. Faults: mil_as_string, nil_weights, no_temp_dir, no_weight_files, skip_compile, skip_load,
// skip_binding_checks, reverse_inputs, hold_lock, no_unload, reuse_request, no_retry.
// skip_binding_checks is honoured by the shared checks (runtime::LoadedProgram::evaluate).
bool fault(const char* name) { return runtime::fault_injected(name); }

struct Pool {  // an autorelease pool for the scope
    NSAutoreleasePool* pool = [[NSAutoreleasePool alloc] init];
    ~Pool() { [pool drain]; }
};

std::string text(NSError* error) { return error ? std::string([[error description] UTF8String]) : std::string(); }

// Runs framework calls; returns "" or, when they raise an Objective-C exception, its text
// (plan::objc_exception_text). `calls` must not throw a C++ exception.
template <class Calls>
std::string guarded(Calls&& calls) {
    @try {
        calls();
    } @catch (NSException* e) {
        NSString* name = [e name];
        NSString* reason = [e reason];
        return plan::objc_exception_text(name ? [name UTF8String] : nullptr, reason ? [reason UTF8String] : nullptr);
    } @catch (id e) {
        return plan::objc_exception_text(nullptr, nullptr);
    }
    return "";
}

struct Framework {
    bool ok = false;
    std::string detail;
    Class descriptor = nil, model = nil, request = nil, surface_object = nil;
};

const Framework& framework() {
    static Framework fw = [] {
        Framework f;
        const std::string path = framework_path();
        void* handle = dlopen(path.c_str(), RTLD_NOW);  // kept open for the life of the process
        if (!handle) {
            const char* err = dlerror();
            f.detail = "dlopen(\"" + path + "\") failed: " + (err ? err : "unknown error");
            return f;
        }
        Pool pool;
        f.descriptor = NSClassFromString(@"_ANEInMemoryModelDescriptor");
        f.model = NSClassFromString(@"_ANEInMemoryModel");
        f.request = NSClassFromString(@"_ANERequest");
        f.surface_object = NSClassFromString(@"_ANEIOSurfaceObject");
        const char* missing = !f.descriptor ? "_ANEInMemoryModelDescriptor"
                              : !f.model    ? "_ANEInMemoryModel"
                              : !f.request  ? "_ANERequest"
                              : !f.surface_object ? "_ANEIOSurfaceObject"
                                                  : nullptr;
        if (missing) {
            f.detail = path + " loaded but has no class " + missing;
            return f;
        }
        f.ok = true;
        f.detail = "AppleNeuralEngine framework loaded from " + path;
        return f;
    }();
    return fw;
}

// IOSurfaces (docs/hardware.md §3), as the ane backend's surface allocator.
void* iosurface_create(size_t bytes, uint8_t** base) {
    const plan::SurfaceProperties p = plan::surface_properties(bytes);
    Pool pool;
    NSDictionary* props = [NSDictionary dictionaryWithObjectsAndKeys:
        [NSNumber numberWithUnsignedLongLong:p.width], (id)kIOSurfaceWidth,
        [NSNumber numberWithUnsignedLongLong:p.height], (id)kIOSurfaceHeight,
        [NSNumber numberWithUnsignedLongLong:p.bytes_per_element], (id)kIOSurfaceBytesPerElement,
        [NSNumber numberWithUnsignedLongLong:p.bytes_per_row], (id)kIOSurfaceBytesPerRow,
        [NSNumber numberWithUnsignedLongLong:p.alloc_size], (id)kIOSurfaceAllocSize,
        [NSNumber numberWithUnsignedInt:p.pixel_format], (id)kIOSurfacePixelFormat, nil];
    IOSurfaceRef surface = IOSurfaceCreate((CFDictionaryRef)props);
    if (!surface) throw EvaluateError("IOSurfaceCreate failed for a " + std::to_string(bytes) + "-byte surface");
    IOSurfaceLock(surface, 0, nullptr);
    *base = static_cast<uint8_t*>(IOSurfaceGetBaseAddress(surface));
    std::memset(*base, 0, bytes);
    IOSurfaceUnlock(surface, 0, nullptr);
    return surface;
}
void iosurface_destroy(void* handle) { CFRelease(static_cast<IOSurfaceRef>(handle)); }
void iosurface_lock(void* handle, bool read_only) {
    IOSurfaceLock(static_cast<IOSurfaceRef>(handle), static_cast<IOSurfaceLockOptions>(read_only ? kIOSurfaceLockReadOnly : 0),
                  nullptr);
}
void iosurface_unlock(void* handle, bool read_only) {
    IOSurfaceUnlock(static_cast<IOSurfaceRef>(handle), static_cast<IOSurfaceLockOptions>(read_only ? kIOSurfaceLockReadOnly : 0),
                    nullptr);
}
const runtime::SurfaceAllocator kIOSurfaces{"iosurface", iosurface_create, iosurface_destroy, iosurface_lock,
                                            iosurface_unlock};

class AneProgram final : public runtime::LoadedProgram {
public:
    // docs/hardware.md §2 steps 1-6. With a donor, the weight-patch path of section 6 (no compile).
    static std::unique_ptr<AneProgram> create(std::string_view mil, const runtime::WeightFiles& weights,
                                              const runtime::CompileOptions& options, const AneProgram* donor) {
        const Framework& fw = framework();
        if (!fw.ok) throw CompileError("the ane backend is unavailable: " + fw.detail);
        // The shared front end, type step included: the emulator refuses the same programs with the
        // same errors. Nothing of the emulator's runs: nothing baked, no frame sized, no host-memory check.
        frontend::CheckedProgram checked = frontend::check(mil, weights, options);
        const plan::ModelPlan layout = plan::plan_model(mil, weights);

        std::unique_ptr<AneProgram> p(new AneProgram(mil, options));
        p->inputs_ = std::move(checked.inputs);
        p->outputs_ = std::move(checked.outputs);
        for (auto& [name, part] : checked.cuts.ranges) p->parts_.push_back(std::move(part));
        Pool pool;
        id mil_arg = fault("mil_as_string")
                         ? (id)[[[NSString alloc] initWithBytes:mil.data() length:mil.size() encoding:NSUTF8StringEncoding] autorelease]
                         : (id)[NSData dataWithBytes:mil.data() length:mil.size()];
        NSMutableDictionary* dict = [NSMutableDictionary dictionary];  // @{} without weights (ANE-18)
        for (const auto& w : layout.weights) {
            NSDictionary* entry = [NSDictionary dictionaryWithObjectsAndKeys:
                [NSNumber numberWithUnsignedLongLong:w.offset], @"offset",
                [NSData dataWithBytes:w.data.data() length:w.data.size()], @"data", nil];
            [dict setObject:entry forKey:[NSString stringWithUTF8String:w.key.c_str()]];
        }
        id descriptor = nil;
        id weights_arg = fault("nil_weights") ? nil : dict;
        std::string raised = guarded([&] { descriptor = [fw.descriptor modelWithMILText:mil_arg weights:weights_arg optionsPlist:nil]; });
        if (!raised.empty())
            throw CompileError(plan::framework_error("_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:", raised));
        if (!descriptor)
            throw CompileError(plan::framework_error("_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:", "") +
                               " (returned nil: the MIL must be NSData and the weights a dictionary, ANE-17/18)");
        id model = nil;
        NSString* hex = nil;
        raised = guarded([&] {
            model = [[fw.model inMemoryModelWithDescriptor:descriptor] retain];
            hex = [model hexStringIdentifier];
        });
        p->model_ = model;
        if (!raised.empty()) throw CompileError(plan::framework_error("_ANEInMemoryModel inMemoryModelWithDescriptor:", raised));
        if (!p->model_) throw CompileError(plan::framework_error("_ANEInMemoryModel inMemoryModelWithDescriptor:", ""));
        const std::string dir = plan::model_dir_path([NSTemporaryDirectory() UTF8String], hex ? [hex UTF8String] : "");
        p->dir_ = plan::lease_model_dir(dir, nullptr);
        if (!fault("no_temp_dir")) {
            plan::ModelPlan written = layout;
            if (fault("no_weight_files")) written.files.resize(1);
            plan::write_model_dir(dir, written);
        }
        NSError* error = nil;
        BOOL compiled = NO;  // the framework already holds this model compiled (libane checks the same)
        if (!donor) {
            raised = guarded([&] {
                compiled = [model respondsToSelector:@selector(compiledModelExists)] && [model compiledModelExists];
            });
            if (!raised.empty()) throw CompileError(plan::framework_error("compiledModelExists", raised));
        }
        switch (plan::compile_step(donor != nullptr, compiled == YES)) {
            case plan::CompileStep::patch:
                plan::write_patch_files(donor->dir_->dir(), dir, weights);
                break;
            case plan::CompileStep::reuse:  // not counted: nothing reaches the device compiler
                break;
            case plan::CompileStep::compile: {
                runtime::consume_compile();  // only what reaches the device compiler counts
                BOOL ok = YES;
                if (!fault("skip_compile"))
                    raised = guarded([&] { ok = [model compileWithQoS:plan::kQoS options:@{} error:&error]; });
                if (!raised.empty()) throw CompileError(plan::framework_error("compileWithQoS:", raised));
                if (!ok) throw CompileError(plan::framework_error("compileWithQoS:", text(error)));
                break;
            }
        }
        if (!fault("skip_load")) {
            const bool retry = !fault("no_retry");
            auto attempt = [model]() -> plan::Attempt {
                NSError* e = nil;
                BOOL ok = NO;
                const std::string thrown = guarded([&] { ok = [model loadWithQoS:plan::kQoS options:@{} error:&e]; });
                if (!thrown.empty()) return {false, thrown};
                return {ok == YES, text(e)};
            };
            const plan::LoadOutcome loaded =
                retry ? plan::load_with_retry(attempt) : plan::LoadOutcome{attempt().ok, 1, "load failed (no retry)"};
            if (!loaded.ok)
                throw CompileError(plan::framework_error("loadWithQoS:", loaded.error) + " (tried " +
                                   std::to_string(loaded.attempts) + " times, " +
                                   std::to_string(plan::kLoadRetryDelay.count()) + " ms apart; ANE-36)");
        }
        p->loaded_ = true;
        return p;
    }

    ~AneProgram() override {
        release_device();
        [last_request_ release];
        [model_ release];
    }

    const char* backend() const override { return "ane"; }

private:
    // docs/hardware.md §2 steps 7-9: a new request per call (ANE-16), surfaces bound in the order
    // check_bindings verified (alphabetical, ANE-20), no lock held (section 3). The live-lanes hint
    // was checked, then ignored: the ANE computes every lane.
    void run(const runtime::Bindings& inputs, const runtime::Bindings& outputs, const runtime::LiveLanes&) override {
        for (const auto* side : {&inputs, &outputs})
            for (const auto& [name, surface] : *side)
                if (&surface->allocator() != &kIOSurfaces)
                    throw EvaluateError("'" + name + "' is bound to a " + surface->allocator().name +
                                        " surface; the ane backend needs IOSurfaces: create surfaces after the "
                                        "backend is chosen (orion.Surface, Program.allocate_surfaces)");
        Pool pool;
        std::vector<runtime::Surface*> held;
        if (fault("hold_lock"))
            for (const auto& b : inputs) {
                b.second->lock(false);
                held.push_back(b.second);
            }
        struct Unlock {
            std::vector<runtime::Surface*>& held;
            ~Unlock() {
                for (auto* s : held) s->unlock();
            }
        } unlock{held};
        const Framework& fw = framework();
        NSMutableArray* ins = [NSMutableArray array];
        NSMutableArray* in_idx = [NSMutableArray array];
        NSMutableArray* outs = [NSMutableArray array];
        NSMutableArray* out_idx = [NSMutableArray array];
        std::vector<IOSurfaceRef> in_surfaces, out_surfaces;
        for (size_t i = 0; i < inputs.size(); ++i)
            in_surfaces.push_back(static_cast<IOSurfaceRef>(inputs[fault("reverse_inputs") ? inputs.size() - 1 - i : i].second->handle()));
        for (const auto& b : outputs) out_surfaces.push_back(static_cast<IOSurfaceRef>(b.second->handle()));
        std::string raised = guarded([&] {
            for (size_t i = 0; i < in_surfaces.size(); ++i) {
                [ins addObject:[fw.surface_object objectWithIOSurface:in_surfaces[i]]];
                [in_idx addObject:[NSNumber numberWithUnsignedLong:i]];
            }
            for (size_t i = 0; i < out_surfaces.size(); ++i) {
                [outs addObject:[fw.surface_object objectWithIOSurface:out_surfaces[i]]];
                [out_idx addObject:[NSNumber numberWithUnsignedLong:i]];
            }
        });
        if (!raised.empty()) throw EvaluateError(plan::framework_error("_ANEIOSurfaceObject objectWithIOSurface:", raised));
        id request = last_request_;
        if (!request || !fault("reuse_request")) {
            raised = guarded([&] {
                request = [fw.request requestWithInputs:ins
                                           inputIndices:in_idx
                                                outputs:outs
                                          outputIndices:out_idx
                                          weightsBuffer:nil
                                              perfStats:nil
                                         procedureIndex:[NSNumber numberWithInt:0]];
            });
            if (!raised.empty()) throw EvaluateError(plan::framework_error("_ANERequest requestWithInputs:...", raised));
            if (!request) throw EvaluateError(plan::framework_error("_ANERequest requestWithInputs:...", ""));
            if (fault("reuse_request")) last_request_ = [request retain];
        }
        NSError* error = nil;
        BOOL ok = NO;
        id model = model_;
        raised = guarded([&] { ok = [model evaluateWithQoS:plan::kQoS options:@{} request:request error:&error]; });
        if (!raised.empty()) throw EvaluateError(plan::framework_error("evaluateWithQoS:", raised));
        if (!ok) throw EvaluateError(plan::framework_error("evaluateWithQoS:", text(error)));
    }

    // Step 10, then the temp dir goes when no other program shares it.
    void release() override {
        const std::string error = release_device();
        if (!error.empty()) throw EvaluateError(error);
    }

    // The weight-patch path: this program is the compiled donor.
    std::unique_ptr<runtime::LoadedProgram> reload(const runtime::WeightFiles& weights) override {
        return create(mil_, weights, options_, this);
    }

    AneProgram(std::string_view mil, runtime::CompileOptions options) : mil_(mil), options_(std::move(options)) {
        loaded_ = false;  // until loadWithQoS: succeeds
    }

    // Unloads when loaded (always: ANE-33) and drops the temp dir lease; returns the error text.
    std::string release_device() {
        std::string error;
        if (loaded_ && !fault("no_unload")) {
            Pool pool;
            NSError* e = nil;
            BOOL ok = NO;
            id model = model_;
            const std::string raised = guarded([&] { ok = [model unloadWithQoS:plan::kQoS error:&e]; });
            if (!raised.empty())
                error = plan::framework_error("unloadWithQoS:", raised);
            else if (!ok)
                error = plan::framework_error("unloadWithQoS:", text(e));
        }
        loaded_ = false;
        dir_.reset();
        return error;
    }

    std::string mil_;
    runtime::CompileOptions options_;
    id model_ = nil;
    id last_request_ = nil;  // only with the reuse_request fault
    std::shared_ptr<plan::DirLease> dir_;
};

std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil, const runtime::WeightFiles& weights,
                                                const runtime::CompileOptions& options) {
    return AneProgram::create(mil, weights, options, nullptr);
}

runtime::BackendStatus probe() {
    const Framework& fw = framework();
    return {"ane", fw.ok, fw.detail};
}

const runtime::SurfaceAllocator* surfaces() { return &kIOSurfaces; }

}  // namespace

std::string framework_path() {
    const char* env = std::getenv("ORION_ANE_FRAMEWORK");
    return env && *env ? env : kFrameworkPath;
}

runtime::Backend backend() {
    runtime::Backend b;
    b.name = "ane";
    b.compile = &compile;
    b.probe = &probe;
    b.surfaces = &surfaces;
    return b;
}

namespace {
[[maybe_unused]] const bool registered = (runtime::register_backend(backend()), true);
}  // namespace

}  // namespace orion::ane
