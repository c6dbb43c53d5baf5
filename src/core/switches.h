// The environment's measurement switches: a variable set to "0" turns a path off to compare
// against (BRISK_FUSED_ATTENTION, BRISK_BF16_ACTIVATIONS, BRISK_RECOMPUTE_ACTIVATION,
// BRISK_LABELLED_ROWS_ONLY, ...), one set to "1" opts into a path that is off by default
// (BRISK_BF16_PRODUCT_OUTPUT, BRISK_RECORDED_STEPS); BRISK_CPU_PRODUCTS names a library. Each is
// read once, when first asked or checked (check_switches at start), and a value the switch does
// not take is refused naming the variable.
#pragma once

#include <string>

namespace brisk {

// Refuses every switch of the table set to a value it does not take (check at start, before
// any work, so that a switch of a path the run never reaches is still checked).
void check_switches();
// Whether switch `name` (of the table) is "0" / is "1".
bool switched_off(const char* name);
bool switched_on(const char* name);
// The value of switch `name` (of the table), "" when unset.
const std::string& switch_value(const char* name);
// Forgets what was read, so that the next ask reads the environment again: for tests that set
// a switch within one process (a path that read its switch into a static keeps it).
void forget_switches();

}  // namespace brisk
