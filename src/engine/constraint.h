/* The public nopad_constraint (include/nopad.h): a compiled grammar (grammar/grammar.h) shared by
 * the requests that use it, each holding a reference. */
#ifndef NOPAD_ENGINE_CONSTRAINT_H
#define NOPAD_ENGINE_CONSTRAINT_H

#include "grammar/grammar.h"
#include "nopad.h"

const grammar *constraint_grammar(const nopad_constraint *c);
/* A request takes a reference while it runs and drops it when freed. */
void constraint_ref(const nopad_constraint *c);
void constraint_unref(const nopad_constraint *c);

#endif
