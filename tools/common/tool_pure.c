/* Compiled into refit_tool_pure beside the library files it carries (with
 * the library's include path, as they are): it sees tool_pure.h and the
 * headers it restates in one translation unit, so that a declaration that
 * differs from the library's (a parameter, a return type) is a compile error
 * rather than a silent mismatch between the programs and the code they link. */
#include "tool_pure.h"

#include "util/crypto.h"
#include "util/json.h"
#include "util/userdir.h"
#include "util/util.h"

/* ISO C wants a translation unit to declare something of its own. */
extern const int tool_pure_checked;
const int tool_pure_checked = 1;
