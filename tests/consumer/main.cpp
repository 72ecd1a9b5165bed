// tests/consumer/main.cpp - the same checks as main.c, compiled as C++.
#include "check.h"

int main() { return consumer_check("C++"); }
