#include "engine/engine.h"

namespace hpcdl {

Engine::Engine(Runtime& runtime) : runtime_(runtime) {}
Engine::~Engine() { stop(); }
Status Engine::start() { return Status::ok(); }
void Engine::stop() {}

}  // namespace hpcdl
