// The keys of transformers' TrainingArguments (4.x and 5.x) and of the example scripts (run_glue,
// run_clm, run_mlm) that brisk has no option of its own for. Each is accepted at the values that
// change nothing about a brisk run, and then listed once as ignored, or refused by name with what
// to do instead; old spellings of brisk's options are read as their new names. One table serves
// option files and flags.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace brisk {

// Whether `name` is such a key.
bool is_trainer_key(const std::string& name);
// Every such key, in the table's order.
std::vector<std::string> trainer_key_names();
// Accepts `value` of key `name` when it changes nothing here; otherwise throws an Error naming
// the key, the value, and what brisk does instead. `origin` opens the message.
void check_trainer_key(const std::string& name, const nlohmann::json& value,
                       const std::string& origin);
// Other spellings of brisk's options, with the option each names.
const std::vector<std::pair<std::string, std::string>>& other_spellings();
// brisk's name for another spelling of one of its options (evaluation_strategy ->
// eval_strategy, no_cuda -> use_cpu, activation_checkpointing -> gradient_checkpointing), or ""
// when `name` is no such spelling.
std::string renamed_option(const std::string& name);
// TrainingArguments' JSON forms of values brisk's options hold otherwise: report_to as a list
// ([] is "none", several names are joined by commas) and greater_is_better as true or false.
nlohmann::json trainer_value_as_option(const std::string& name, const nlohmann::json& value);
// The value a flag's text stands for, as HfArgumentParser reads it: a number, true/false (any
// case, yes, no), None or null, a JSON list or object, else the text itself. A flag given without
// a value is true.
nlohmann::json flag_value(const std::string& text);

}  // namespace brisk
