// A storage header that includes the Engine API: layering_test.sh must reject it
// (tests/CMakeLists.txt, layering_test_rejects_upward_include).
#include "ckv/engine.h"
